"""A client's cap on requests in flight (arrival.max_concurrency, vllm bench serve --max-concurrency): a request is
sent when one before it has come back whole, never before its own arrival; the engine's rejections free slots."""

from __future__ import annotations

import pandas as pd
import pytest

from kvbench.harness.front.job import run_job
from kvbench.harness.serving.client_cap import CappedClientSource
from kvbench.harness.serving.sequence import Sequence
from kvbench.harness.serving.workload import Request


def back(request_id: int, at: float | None, sample: int = 0) -> Sequence:
    s = Sequence(sample, request_id, sample, (1,), 1, output_ids=[1])
    s.finish_s = at
    return s


def sent(src: CappedClientSource, now: float) -> list[tuple[int, float]]:
    return [(r.request_id, r.arrival_s) for r in src.due(now)]


def test_the_first_c_go_at_once_then_one_each_time_one_comes_back():
    src = CappedClientSource([Request(i, (i,), 1) for i in range(5)], cap=2)
    assert sent(src, 0.0) == [(0, 0.0), (1, 0.0)]
    assert src.next_arrival() is None  # nothing more until one is back
    src.finished([back(1, 0.3)])
    assert sent(src, 0.3) == [(2, 0.3)]  # in arrival order, whichever slot freed
    src.finished([back(0, 0.5), back(2, 0.5)])
    assert sent(src, 0.5) == [(3, 0.5), (4, 0.5)]
    src.finished([back(3, 0.9), back(4, 1.0)])
    assert src.next_arrival() is None and [r.request_id for r in src.released] == [0, 1, 2, 3, 4]


def test_a_request_is_never_sent_before_its_own_arrival():
    reqs = [Request(0, (0,), 1, 1, 0.0), Request(1, (1,), 1, 1, 2.0), Request(2, (2,), 1, 1, 0.5)]
    src = CappedClientSource(reqs, cap=1)
    assert sent(src, 0.0) == [(0, 0.0)]
    src.finished([back(0, 0.1)])
    assert src.next_arrival() == 0.5  # request 2 arrives before request 1: arrival order, not list order
    assert sent(src, 0.5) == [(2, 0.5)]
    src.finished([back(2, 0.7)])
    assert sent(src, 1.0) == [] and sent(src, 2.0) == [(1, 2.0)]


def test_parallel_samples_hold_the_slot_until_the_last_is_back_and_a_rejection_frees_it_at_once():
    src = CappedClientSource([Request(0, (0,), 1, 2), Request(1, (1,), 1), Request(2, (2,), 1)], cap=1)
    assert sent(src, 0.0) == [(0, 0.0)]
    src.finished([back(0, 0.2, sample=1)])
    assert src.next_arrival() is None  # sample 0 still out
    src.finished([back(0, 0.4, sample=0)])
    assert sent(src, 0.4) == [(1, 0.4)]
    src.rejected([back(1, None)], 0.45)  # never fits: the server answers with an error now
    assert sent(src, 0.45) == [(2, 0.45)]
    with pytest.raises(ValueError, match="at least 1"):
        CappedClientSource([], cap=0)


def _run(compose, tmp_path, extra: list[str]) -> pd.DataFrame:
    rows, code = run_job(compose([
        "scenario=capacity", "+impl=paged", "model=tiny-llama", "gpu=l4", "dtype=bfloat16", "max_seq_len=256",
        "batch=64", "workload=fixed", "workload.prompt_len=64", "workload.output_len=16", "workload.num_requests=7",
        "arrival=burst", "engine=vllm_v1", "engine.offline=false", *extra]), tmp_path)
    assert code == 0 and rows[0]["status"] == "ok", rows[0].get("error")
    return pd.read_csv(tmp_path / "requests.csv")


def test_on_the_simulated_clock_at_most_c_are_in_flight_and_each_is_sent_when_one_is_back(compose, tmp_path):
    reqs = _run(compose, tmp_path, ["arrival.max_concurrency=3"]).sort_values("arrival_s")
    assert (reqs.arrival_s.iloc[:3] == 0).all()
    finishes = set(reqs.finish_s.round(12))
    assert all(round(t, 12) in finishes for t in reqs.arrival_s.iloc[3:])  # sent as one came back
    for t in reqs.arrival_s:  # in flight at each send: sent by then and not back yet (the one sent counts)
        assert ((reqs.arrival_s <= t) & (reqs.finish_s > t)).sum() <= 3


def test_without_the_cap_the_engines_batch_takes_them_all(compose, tmp_path):
    """The comparison can fail: the same run without the client's cap has all 7 in flight at t=0."""
    reqs = _run(compose, tmp_path, [])
    assert (reqs.arrival_s == 0).all() and ((reqs.finish_s > 0).sum() == 7)


@pytest.mark.parametrize("extra,message", [
    (["arrival.max_concurrency=0"], "must be a whole number >= 1"),
    (["scenario=kernel", "arrival.max_concurrency=2"], "runs in scenario="),
])
def test_a_bad_cap_is_one_clear_error(compose, tmp_path, extra, message):
    rows, code = run_job(compose(["+impl=paged", "model=tiny-llama", *extra]), tmp_path)
    assert code != 0 and message in rows[0]["error"]


def test_on_the_wall_clock_the_engine_serves_the_same_client(compose, tmp_path):
    rows, code = run_job(compose([
        "+impl=paged_torch", "model=tiny-llama", "device=cpu", "dtype=float32", "max_seq_len=128", "batch=8",
        "workload=fixed", "workload.prompt_len=16", "workload.output_len=4", "workload.num_requests=5",
        "arrival.max_concurrency=2"]), tmp_path)
    assert code == 0 and rows[0]["status"] == "ok", rows[0].get("error")
    reqs = pd.read_csv(tmp_path / "requests.csv").sort_values("arrival_s")
    assert (reqs.arrival_s.iloc[:2] == 0).all() and (reqs.arrival_s.iloc[2:] > 0).all()
    for t in reqs.arrival_s:
        assert ((reqs.arrival_s <= t) & (reqs.finish_s > t)).sum() <= 2
