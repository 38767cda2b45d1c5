"""conf/engine/: every profile loads, validates and cites its figures; engine=NAME on the command line (bad values are
one line naming the key and the range); the engine's chunked-prefill default and token budget by card; and capacity runs priced by two engines
(V0 slower by the published difference, the front-end cost on an online run's TTFT and E2EL only)."""

from __future__ import annotations

import pandas as pd
import pytest

from kvbench.harness.errors import ConfigError
from kvbench.harness.front.job import run_job
from kvbench.harness.front.resolve import resolve
from kvbench.harness.serving.cost_model import cost_model_for
from tests.conftest import REPO_ROOT

ENGINES = sorted(p.stem for p in (REPO_ROOT / "conf" / "engine").glob("*.yaml"))
FIGURES = ("step_overhead_us", "seq_overhead_us", "layer_overhead_us", "frontend_ms", "chunked_prefill",
           "async_scheduling", "scheduler_steps")
CAPACITY = ["scenario=capacity", "model=llama-3.1-8b", "gpu=h100-sxm", "+impl=paged_torch", "workload=fixed",
            "workload.prompt_len=128", "workload.output_len=64", "timeline_tables=false", "max_seq_len=512"]
# Issue 46's published fixed costs a step: vLLM V0 about 2.6 ms, V1 about 1.0 ms (both on an A100).
PUBLISHED_V0_MINUS_V1_S = 2.6e-3 - 1.0e-3


def _comment_of(text: list[str], i: int) -> str:
    above = []
    j = i - 1
    while j >= 0 and text[j].startswith("#"):
        above.insert(0, text[j])
        j -= 1
    return " ".join(above + [text[i].partition("#")[2]]).lower()


def test_the_four_engines_are_there():
    # at least these: a user's own profile (kvbench calibrate writes conf/engine/NAME_calibrated.yaml) is one more
    assert {"sglang", "trtllm", "vllm_v0", "vllm_v1"} <= set(ENGINES)


@pytest.mark.parametrize("name", ENGINES)
def test_each_profile_loads_validates_and_cites_each_figure(compose, name):
    cfg = resolve(compose(["scenario=capacity", "model=llama-3.1-8b", "gpu=h100-sxm", f"engine={name}"]))
    engine = cost_model_for(cfg).engine
    assert engine.name == name and engine.scheduler_steps >= 1 and engine.step_overhead_us > 0
    text = (REPO_ROOT / "conf" / "engine" / f"{name}.yaml").read_text().splitlines()
    for key in FIGURES:  # set here, with a comment naming its source or saying it is an assumption
        (i,) = [i for i, line in enumerate(text) if line.startswith(f"{key}:")]
        comment = _comment_of(text, i)
        assert key in comment, f"{name}: {key} has no comment of its own"
        assert any(w in comment for w in ("assumption", "issue 46", "http", ".html", "blog", "pr #", "issue #",
                                          "default")), f"{name}: {key}: {comment!r}"
    assert cfg.chunked_prefill is engine_default(name, "chunked_prefill")


def engine_default(name: str, key: str):
    from omegaconf import OmegaConf

    return OmegaConf.load(REPO_ROOT / "conf" / "engine" / f"{name}.yaml")[key]


def test_gpu_alone_prices_vllm_v1_and_no_gpu_leaves_the_cpu_paths_as_they_were(compose):
    cfg = resolve(compose(["scenario=capacity", "model=llama-3.1-8b", "gpu=h100-sxm"]))
    assert cfg.engine.name == "vllm_v1" and cfg.chunked_prefill is True and cfg.engine.frontend_ms == 19
    assert resolve(compose(["scenario=capacity", "model=llama-3.1-8b", "gpu=h100-sxm", "chunked_prefill=false"])
                   ).chunked_prefill is False  # the top-level key wins over the engine's default
    cpu = resolve(compose(["scenario=capacity", "model=llama-3.1-8b", "device.memory_gb=80"]))
    assert cpu.engine is None and cpu.chunked_prefill is False
    # A real decode run with a GPU named keeps whole-prompt prefill unless asked.
    assert resolve(compose(["scenario=decode", "device=cpu", "gpu=h200"])).chunked_prefill is False


def test_bad_engine_input_is_one_line_naming_the_key(compose):
    with pytest.raises(ConfigError, match=r"^engine\.frontend_ms=-1\.0 must be a number in \[0, 10000\] "
                                          r"\(engine=sglang\)"):
        resolve(compose(CAPACITY + ["engine=sglang", "engine.frontend_ms=-1"]))
    with pytest.raises(ConfigError, match=r"^engine\.scheduler_steps=0 must be an integer in \[1, 256\]"):
        resolve(compose(CAPACITY + ["engine=vllm_v0", "engine.scheduler_steps=0"]))
    with pytest.raises(ConfigError, match=r"^engine=vllm_v0 prices the simulated clock's steps .* needs gpu=NAME"):
        resolve(compose(["scenario=capacity", "model=llama-3.1-8b", "device.memory_gb=80", "engine=vllm_v0"]))


def _row(compose, tmp_path, label: str, extra: list[str]) -> pd.Series:
    (row,), code = run_job(compose(CAPACITY + extra), tmp_path / label)
    assert code == 0, row.get("error")
    return pd.Series(row)


def test_v0_is_slower_than_v1_by_the_published_step_cost(compose, tmp_path):
    # Batch 1, in series, whole prompts for both: TPOT differs by V0's and V1's host costs a step.
    same = ["batch=1", "workload.num_requests=2", "chunked_prefill=false"]
    v0 = _row(compose, tmp_path, "v0", same + ["engine=vllm_v0"])
    v1 = _row(compose, tmp_path, "v1", same + ["engine=vllm_v1"])
    gap_s = (v0["tpot_ms_mean"] - v1["tpot_ms_mean"]) / 1e3
    assert gap_s == pytest.approx(PUBLISHED_V0_MINUS_V1_S, rel=0.10)
    # The constants' own difference, per sequence included: (2600 + 20) - (1000 + 10) us.
    assert gap_s == pytest.approx(1.61e-3, rel=1e-6)


def test_the_front_end_cost_is_on_an_online_runs_ttft_and_e2el(compose, tmp_path):
    online = ["batch=1", "workload.num_requests=3", "arrival=constant", "arrival.rate=1", "engine=vllm_v1"]
    rows = {fe: _row(compose, tmp_path, f"online{fe}", online + [f"engine.frontend_ms={fe}"]) for fe in (0, 19)}
    for metric in ("ttft_ms_mean", "e2el_ms_mean"):
        assert rows[19][metric] - rows[0][metric] == pytest.approx(19, rel=1e-6)
    assert rows[19]["tpot_ms_mean"] == pytest.approx(rows[0]["tpot_ms_mean"], rel=1e-9)
    # Offline: every request at t=0 (arrival=burst), or engine.offline=true: no front-end.
    burst = ["batch=1", "workload.num_requests=3", "engine=vllm_v1"]
    assert (_row(compose, tmp_path, "burst19", burst + ["engine.frontend_ms=19"])["ttft_ms_mean"]
            == pytest.approx(_row(compose, tmp_path, "burst0", burst + ["engine.frontend_ms=0"])["ttft_ms_mean"]))
    told = _row(compose, tmp_path, "told", online + ["engine.frontend_ms=19", "engine.offline=true"])
    assert told["ttft_ms_mean"] == pytest.approx(rows[0]["ttft_ms_mean"], rel=1e-9)


def test_a_saved_config_from_before_the_engines_replays_at_its_host_costs():
    from kvbench.harness.front.replay import upgraded

    data = upgraded({"chunked_prefill": False, "gpu": {"name": "h100-sxm", "step_overhead_us": 500,
                                                        "layer_overhead_us": 30, "memory_mib": 81559}})
    assert "step_overhead_us" not in data["gpu"] and "layer_overhead_us" not in data["gpu"]
    assert data["engine"] == {"name": "vllm_v1", "step_overhead_us": 500, "layer_overhead_us": 30,
                              "seq_overhead_us": 0.0, "frontend_ms": 0.0, "async_scheduling": False,
                              "scheduler_steps": 1, "chunked_prefill": False}


def test_an_engine_key_without_an_engine_is_one_line(compose):
    from kvbench.harness.front.compose_errors import _unchosen_group_key

    said = _unchosen_group_key(["gpu=h100-sxm", "engine.async_scheduling=true"])
    assert said.startswith("engine.async_scheduling=true sets a key of engine, but no engine is chosen; choose one "
                           "with engine=NAME (allowed: sglang, trtllm, vllm_v0, vllm_v1)")


def _budget(compose, *extra: str) -> int:
    return resolve(compose(["scenario=capacity", "model=qwen2.5-0.5b", *extra])).max_num_batched_tokens


@pytest.mark.parametrize("extra, expected", [
    # vLLM V1 (EngineArgs.get_batch_defaults): under 70 GiB, or an A100, 2048 served and 8192 offline ...
    (["gpu=l4", "arrival=poisson", "arrival.rate=1"], 2048),
    (["gpu=l4", "engine=vllm_v1", "arrival=burst", "arrival.max_concurrency=8", "engine.offline=false"], 2048),
    (["gpu=l4"], 8192),  # arrival=burst: an offline batch
    (["gpu=a100-80gb", "arrival=poisson", "arrival.rate=1"], 2048),
    (["gpu=a100-80gb"], 8192),
    # ... 70 GiB and more: 8192 served, 16384 offline
    (["gpu=h100-sxm", "arrival=poisson", "arrival.rate=1"], 8192),
    (["gpu=h200"], 16384),
    # SGLang's --chunked-prefill-size by memory alone: 2048 under 35 GiB, 8192 under 160 GiB
    (["gpu=rtx-4090", "engine=sglang"], 2048),
    (["gpu=h200", "engine=sglang", "arrival=poisson", "arrival.rate=1"], 8192),
    # no tiers in the file (V0, TensorRT-LLM), no engine, or a scenario that computes: kvbench's 8192
    (["gpu=l4", "engine=vllm_v0", "arrival=poisson", "arrival.rate=1"], 8192),
    (["gpu=l4", "engine=trtllm"], 8192),
    (["device.memory_gb=80"], 8192),
    # a budget the command line gives wins, and gpu.memory_mib decides the tier as the file's would
    (["gpu=l4", "arrival=poisson", "arrival.rate=1", "max_num_batched_tokens=512"], 512),
    (["gpu=l4", "gpu.memory_mib=81920", "arrival=poisson", "arrival.rate=1"], 8192),
])
def test_the_engines_token_budget_by_card_and_mode(compose, extra, expected):
    assert _budget(compose, *extra) == expected


def test_a_run_that_computes_keeps_kvbenchs_budget(compose):
    assert resolve(compose(["scenario=decode", "device=cpu", "gpu=l4"])).max_num_batched_tokens == 8192


def test_a_bad_token_budget_tier_is_one_line(compose):
    from kvbench.harness.config import TokenBudgetTier
    from kvbench.harness.serving.engine_profile import token_budget

    with pytest.raises(ConfigError, match=r"^engine\.token_budget: a tier's online=0 must be an integer >= 1"):
        token_budget([TokenBudgetTier(online=0, offline=8)], "l4", 23034, False)
    with pytest.raises(ConfigError, match=r"^engine\.token_budget: no tier applies to gpu=a100-80gb \(80\.0 GiB\)"):
        token_budget([TokenBudgetTier(min_memory_gib=70, except_gpus=["a100"], online=8, offline=8)], "a100-80gb",
                     81920, True)
