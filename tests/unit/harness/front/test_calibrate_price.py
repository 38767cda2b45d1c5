"""The command line that prices a user's run under chosen constants (no simulation here: the end-to-end fit in
test_calibrate.py runs them)."""

from __future__ import annotations

import json

from kvbench.harness.front.calibrate_points import Setup, read_result
from kvbench.harness.front.calibrate_price import Pricer, command, fmt
from tests.unit.harness.front.test_calibrate_points import closed_loop

CONSTANTS = {"frontend_ms": 40.0, "step_overhead_us": 2000.0, "seq_overhead_us": 12.5}


def _run(tmp_path, **changes):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(closed_loop(**changes)))
    return read_result(path, Setup(gpu="l4", model="qwen2.5-0.5b"))


def _last(args: list[str], key: str) -> str:
    """What Hydra takes for ``key``: the last value given."""
    return [a for a in args if a.startswith(key + "=")][-1].partition("=")[2]


def test_a_closed_loop_runs_through_a_server_with_the_constants_and_the_engine_named(tmp_path):
    args = command(_run(tmp_path), "vllm_v1", CONSTANTS, cap=50)
    assert _last(args, "arrival") == "burst" and _last(args, "arrival.max_concurrency") == "8"
    assert _last(args, "engine") == "vllm_v1" and _last(args, "engine.offline") == "false"
    assert [_last(args, f"engine.{k}") for k in CONSTANTS] == ["40", "2000", "12.5"]
    assert _last(args, "workload.num_requests") == "50" and _last(args, "workload.prompt_len") == "256"
    assert sum(a.startswith("engine=") for a in args) == 1  # the file's engine is the user's, named once


def test_every_prompt_at_once_without_a_client_cap_runs_vllms_max_num_seqs(tmp_path):
    args = command(_run(tmp_path, max_concurrency=None), "sglang", CONSTANTS, cap=50)
    assert _last(args, "batch") == "256" and _last(args, "workload.num_requests") == "50"
    assert _last(args, "engine.offline") == "false"  # a server in front, unlike the clock check's offline points
    assert not any(a.startswith("arrival.max_concurrency=") for a in args)


def test_a_rate_with_a_client_cap_and_bursty_arrivals_keep_both(tmp_path):
    args = command(_run(tmp_path, request_rate=3.0, burstiness=0.25), "vllm_v1", CONSTANTS, cap=50)
    assert _last(args, "arrival") == "gamma" and _last(args, "arrival.burstiness") == "0.25"
    assert _last(args, "arrival.rate") == "3" and _last(args, "arrival.max_concurrency") == "8"


def test_constants_are_priced_as_the_profile_writes_them():
    assert [fmt(v) for v in (40.0, 2000.0004, 12.3456, 0.0, 1e-5)] == ["40", "2000", "12.346", "0", "0"]
    assert Pricer.key([40.00001, 1999.9996, 10]) == (40.0, 2000.0, 10.0)
