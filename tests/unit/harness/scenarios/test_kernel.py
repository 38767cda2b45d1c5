"""scenario=kernel: one point per job, the kernel from the registry, the layouts from the cache kind."""

from __future__ import annotations

import pytest

import kvbench.kernels.sdpa
from kvbench.harness.measure.timing import HostClock, time_call
from kvbench.harness.front.job import run_job

POINT = ["scenario=kernel", "dtype=float32", "batch=3", "scenario.context_len=37", "scenario.warmup=2",
         "scenario.iters=3"]
TINY = [*POINT, "model=tiny-llama"]


def test_the_point_is_the_top_level_keys_and_the_models_heads(compose, tmp_path):
    rows, code = run_job(compose(["+impl=paged_cuda", *POINT, "block_size=8", "model=tiny-mistral"]), tmp_path)
    assert code == 0, rows[0].get("error")
    assert {r["layout"] for r in rows} == {"paged", "contiguous"}
    for r in rows:
        assert r["status"] == "ok" and r["model"] == "tiny-mistral" and r["kernel_batch"] == r["batch"] == 3
        assert (r["context_len"], r["block_size"]) == (37, 8)
        assert (r["num_heads"], r["num_kv_heads"], r["head_dim"]) == (8, 2, 64)  # conf/model/tiny-mistral.yaml
        assert r["max_abs_err"] < 1e-5


def test_contiguous_rows_time_the_registered_sdpa_kernel_on_a_slab_view(compose, tmp_path, monkeypatch):
    calls = []

    def counted(q, k, v, block_tables, context_lens, scale, out=None, **hints):
        # The slab as a view of the pool (no gather inside the timed call), no table, no mask.
        calls.append((k.shape, k._base is not None, block_tables, context_lens, out))
        return slab_decode(q, k, v, block_tables, context_lens, scale, out, **hints)

    slab_decode = kvbench.kernels.sdpa.slab_decode
    monkeypatch.setattr(kvbench.kernels.sdpa, "slab_decode", counted)
    (row,), code = run_job(compose(["+impl=contiguous", *TINY]), tmp_path)
    assert code == 0 and row["status"] == "ok", row.get("error")
    assert (row["kernel_backend"], row["layout"], row["block_size"]) == ("sdpa", "contiguous", None)
    assert row["max_abs_err"] < 1e-5  # against the torch reference over the same blocks
    assert len(calls) == 1 + 2 + 3  # checked once, warm-up, timed
    assert calls[0] == ((3, 37, 2, 64), True, None, None, None)


def test_a_slab_is_timed_once_across_block_sizes_when_the_sweep_says_so(compose, tmp_path):
    once = ["+impl=contiguous", *TINY, "scenario.slab_block_size=16"]
    (timed,), _ = run_job(compose([*once, "block_size=16"]), tmp_path / "16")
    (skipped,), code = run_job(compose([*once, "block_size=32"]), tmp_path / "32")
    assert timed["status"] == "ok" and code == 0
    assert skipped["status"] == "skipped" and "timed in the block_size=16 job" in skipped["error"]


def test_a_reservation_policy_has_no_kernel_of_its_own(compose, tmp_path):
    (row,), code = run_job(compose(["+impl=orca_pow2", *TINY]), tmp_path)
    assert code == 0 and row["status"] == "skipped"
    assert row["error"].startswith("impl.reservation=pow2: a memory policy over the contiguous impl's SDPA")


def test_the_triton_interpreter_skips_large_points(compose, tmp_path):
    rows, code = run_job(compose(["+impl=paged_triton", *TINY, "scenario.context_len=20000"]), tmp_path)
    assert code == 0 and [r["layout"] for r in rows] == ["paged", "contiguous"]
    assert all(r["status"] == "skipped" and "Triton interpreter" in r["error"] for r in rows)


def test_the_triton_interpreter_is_timed_once_after_its_checked_call(compose, tmp_path):
    """Its time is the interpreter's, not the kernel's: one timed call (scenario.iters=3 is for real kernels)."""
    rows, code = run_job(compose(["+impl=paged_triton", *TINY]), tmp_path)
    assert code == 0 and [r["layout"] for r in rows] == ["paged", "contiguous"]
    for r in rows:
        assert r["status"] == "ok" and r["kernel_backend"] == "triton-interpreter" and r["max_abs_err"] < 1e-5
        assert "interpreted: 1 timed call" in r["notes"]  # (a contention note may follow it)
        assert r["latency_us_p10"] == r["latency_us_p50"] == r["latency_us_p90"]  # one sample


class FakeClock:
    """Hands out the given durations, one per timed call."""

    method = "fake"

    def __init__(self, durations: list[float]) -> None:
        self.durations = iter(durations)

    def time(self, fn):
        fn()
        return next(self.durations)

    def seconds(self, handles):
        return handles


@pytest.mark.parametrize("warmup, iters", [(0, 1), (3, 5), (2, 0)])
def test_time_call_runs_warmup_then_iters_timed_calls(warmup, iters):
    calls = []
    durations = [0.004, 0.001, 0.003, 0.002, 0.005][: max(1, iters)]
    t = time_call(lambda: calls.append(1), None, warmup, iters, clock=FakeClock(durations))
    assert len(calls) == warmup + max(1, iters) and t.method == "fake"
    assert t.median_s == pytest.approx(sorted(durations)[len(durations) // 2])
    assert t.p10_s <= t.median_s <= t.p90_s


def test_host_clock_times_each_call():
    import time

    assert HostClock().time(lambda: time.sleep(0.01)) >= 0.01


@pytest.mark.gpu
def test_cuda_timing_honours_warmup_and_iters():
    import torch

    calls = []
    x = torch.randn(1 << 20, device="cuda")

    def fn():
        calls.append(1)
        torch.cuda._sleep(1_000_000)  # about 0.5-1 ms of GPU time
        x.mul_(1.0)

    t = time_call(fn, torch.device("cuda"), warmup=4, iters=7)
    assert len(calls) == 4 + 1 + 7 and t.method == "cuda-events"  # warm-up, the enqueue calibration, timed
    assert 1e-4 < t.p10_s <= t.median_s <= t.p90_s < 0.1
