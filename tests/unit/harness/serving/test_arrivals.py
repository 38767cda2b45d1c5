"""Arrival processes: their gap statistics, their own random stream, and burst = the runs before them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvbench.harness.serving.arrivals import arrival_times
from kvbench.harness.config import ArrivalConfig, WorkloadConfig
from kvbench.harness.scenarios.context import JobContext
from kvbench.harness.errors import ConfigError
from kvbench.harness.front.groups import _load
from kvbench.harness.front.resolve import resolve
from kvbench.harness.serving.workload import _lengths, draw_workload, generate_requests, workload_digest
from tests.conftest import REPO_ROOT

COUNT = 20_001  # 20,000 gaps


def gaps(cfg: ArrivalConfig, seed: int = 0) -> np.ndarray:
    times = arrival_times(cfg, COUNT, seed)
    assert times[0] == 0.0 and len(times) == COUNT
    return np.diff(times)


@pytest.mark.parametrize("name, burstiness", [("poisson", 1.0), ("gamma", 0.5), ("gamma", 1.0), ("gamma", 2.0)])
def test_gap_mean_and_coefficient_of_variation(name, burstiness):
    rate = 4.0
    g = gaps(ArrivalConfig(name=name, rate=rate, burstiness=burstiness))
    assert (g >= 0).all()
    assert g.mean() == pytest.approx(1 / rate, rel=0.05)
    assert g.std() / g.mean() == pytest.approx(1 / np.sqrt(burstiness), rel=0.10)


def test_poisson_is_gamma_with_burstiness_one_draw_for_draw():
    poisson = arrival_times(ArrivalConfig(name="poisson", rate=3.0, burstiness=0.25), 500, seed=7)
    gamma = arrival_times(ArrivalConfig(name="gamma", rate=3.0, burstiness=1.0), 500, seed=7)
    assert poisson == gamma  # poisson ignores burstiness


def test_constant_is_exact_and_burst_is_all_zero():
    assert arrival_times(ArrivalConfig(name="constant", rate=4.0), 5, seed=0) == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert arrival_times(ArrivalConfig(name="burst", rate=4.0), 4, seed=0) == [0.0] * 4
    assert arrival_times(ArrivalConfig(name="poisson", rate=1.0), 0, seed=0) == []


def test_trace_times_start_at_zero_and_scale():
    cfg = ArrivalConfig(name="trace", time_scale=0.5)
    assert arrival_times(cfg, 3, seed=0, trace_s=[100.0, 102.0, 110.0]) == [0.0, 1.0, 5.0]
    with pytest.raises(ConfigError, match="arrival=trace"):
        arrival_times(cfg, 3, seed=0)


def test_seed_picks_the_stream_and_rate_only_scales_it():
    at = lambda rate, seed: np.array(arrival_times(ArrivalConfig(name="poisson", rate=rate), 50, seed))  # noqa: E731
    assert (at(2.0, 1) == at(2.0, 1)).all() and not (at(2.0, 1) == at(2.0, 2)).all()
    assert at(1.0, 1) / 2 == pytest.approx(at(2.0, 1), rel=1e-12)  # the same draws, twice as fast


# Digests computed by the code before arrival times existed (git bd9094f), vocab 4096.
RECORDED = {
    ("chat", 8, 1024, 0): "418931c10051cde5",
    ("chat", 64, 256, 3): "765c97b7a1c3429a",
    ("chat", 200, 100, 1): "8c1635193fd60a21",  # heavily clipped
    ("fixed", 8, 1024, 0): "859673145dabeafc",
    ("fixed", 64, 256, 3): "937bae2adbcf6456",
    ("uniform", 8, 1024, 0): "08b5dc9e76c7ce93",
    ("uniform", 64, 256, 3): "a32e500a56737547",
    ("shared_prefix", 8, 1024, 0): "1279ee4814dbb0f1",
    ("shared_prefix", 64, 256, 3): "ec7c4274deabb256",
    ("parallel_sampling", 8, 1024, 0): "0ba3d087f6562139",
    ("parallel_sampling", 64, 256, 3): "973259f79b8d4e9e",
    ("seeds", 8, 1024, 0): "9516fc57c0fb0729",
}


def preset(name: str) -> WorkloadConfig:
    return _load(REPO_ROOT / "conf" / "workload" / f"{name}.yaml", WorkloadConfig)


@pytest.mark.parametrize("key", list(RECORDED), ids=lambda k: "-".join(map(str, k)))
def test_burst_reproduces_the_digests_recorded_before_arrivals(key):
    name, count, max_seq_len, seed = key
    assert workload_digest(generate_requests(preset(name), count, 4096, max_seq_len, seed)) == RECORDED[key]


def context(compose, tmp_path: Path, *overrides: str) -> JobContext:
    cfg = resolve(compose(["model=tiny-llama", "device=cpu", "batch=4", "workload.num_requests=12", *overrides]))
    return JobContext(cfg, tmp_path, fingerprint=None)


def test_run_requests_carry_arrivals_and_nothing_else_changes(compose, tmp_path):
    burst = context(compose, tmp_path)
    assert burst.job.cfg.arrival.name == "burst" and all(r.arrival_s == 0 for r in burst.workload.requests)
    direct = generate_requests(burst.job.cfg.workload, 12, 4096, burst.job.cfg.max_seq_len, burst.job.cfg.seed)
    assert workload_digest(burst.workload.requests) == workload_digest(direct)
    slow = context(compose, tmp_path, "arrival=poisson", "arrival.rate=2")
    fast = context(compose, tmp_path, "arrival=poisson", "arrival.rate=20")
    gam = context(compose, tmp_path, "arrival=gamma", "arrival.rate=20")
    for ctx in (slow, fast, gam):
        assert [(r.prompt_ids, r.output_len, r.n) for r in ctx.workload.requests] == \
            [(r.prompt_ids, r.output_len, r.n) for r in burst.workload.requests]
    assert slow.workload.requests[0].arrival_s == 0 and slow.workload.requests[-1].arrival_s > 0
    assert [r.arrival_s / 10 for r in slow.workload.requests] == pytest.approx([r.arrival_s for r in fast.workload.requests])
    digests = {workload_digest(c.workload.requests) for c in (burst, slow, fast, gam)}
    assert len(digests) == 4  # the digest covers arrival times


@pytest.mark.parametrize("overrides, note", [
    (["arrival.rate=50"], "arrival.rate=50 ignored: arrival=burst sends every request at t=0"),
    (["arrival=poisson", "arrival.rate=50"], None),
    ([], None),  # burst without a rate: nothing to say
])
def test_a_rate_burst_ignores_is_in_the_rows_notes(compose, tmp_path, overrides, note):
    """Not an error (a sweep sets arrival.rate for burst and poisson jobs alike), but said in the row."""
    from kvbench.harness.front.job import run_job

    sim = ["+impl=paged_torch", "scenario=capacity", "model=llama-2-13b", "gpu=a100-40gb", "max_seq_len=2048",
           "batch=8", "workload=sharegpt", "workload.num_requests=16"]
    (row,), code = run_job(compose([*sim, *overrides]), tmp_path)
    assert code == 0, row.get("error")
    assert (note in (row["notes"] or "")) if note else "ignored" not in (row["notes"] or "")
    assert row["request_rate"] == (50 if "arrival=poisson" in overrides else None)


def test_clipped_requests_are_counted_in_the_notes():
    cfg, count, max_seq_len, seed = preset("chat"), 200, 100, 1
    rng = np.random.Generator(np.random.PCG64(seed))
    prompt, output = _lengths(cfg, cfg.prompt_len, count, rng), _lengths(cfg, cfg.output_len, count, rng)
    clipped, cut = int((prompt + output > max_seq_len).sum()), int((prompt > max_seq_len - 1).sum())
    assert (clipped, cut) == (159, 61)
    (note,) = draw_workload(cfg, count, 4096, max_seq_len, seed).notes
    assert note == f"{clipped} of {count} requests clipped to max_seq_len={max_seq_len} " \
                   f"({cut} with the prompt cut to leave 1 output token)"
    assert draw_workload(cfg, count, 4096, 4096, seed).notes == ()


@pytest.mark.parametrize("name, means", [("sharegpt", (161.31, 337.99)), ("alpaca", (19.31, 58.45))])
def test_paper_presets_have_the_papers_means_and_a_long_tail(name, means):
    reqs = generate_requests(preset(name), 20_000, 4096, 1 << 16, seed=0)
    prompt = np.array([len(r.prompt_ids) for r in reqs])
    output = np.array([r.output_len for r in reqs])
    assert prompt.mean() == pytest.approx(means[0], rel=0.03)
    assert output.mean() == pytest.approx(means[1], rel=0.03)
    for lengths in (prompt, output):  # long-tailed: the mean above the median, a tail past 3x the mean
        assert np.median(lengths) < 0.8 * lengths.mean() and lengths.max() > 3 * lengths.mean()


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["arrival=poisson"], "arrival.rate"),
        (["arrival=constant", "arrival.rate=0"], "arrival.rate=0.0 must be > 0"),
        (["arrival=gamma", "arrival.rate=-2"], "arrival.rate=-2.0 must be > 0"),
        (["arrival=gamma", "arrival.rate=1", "arrival.burstiness=0"], "arrival.burstiness=0.0 must be > 0"),
        (["arrival=trace", "arrival.time_scale=0"], "arrival.time_scale=0.0 must be > 0"),
        (["arrival.name=sometimes"], "arrival.name='sometimes' is not allowed"),
        (["arrival=trace"], "arrival=trace needs arrival times"),
        (["workload=fixed", "workload.prompt_len=10.5"], "workload.prompt_len=10.5"),
    ],
)
def test_bad_arrival_is_a_config_error_naming_the_key(compose, overrides, key):
    with pytest.raises(ConfigError) as err:
        resolve(compose(["model=tiny-llama", "device=cpu", *overrides]))
    assert key in str(err.value) and "\n" not in str(err.value)
