"""Memory tracker (no NVML here; NVML mocked at the pynvml boundary) and the max-concurrency search."""

from __future__ import annotations

import os
import sys
import time
import types

import pytest

from harness.measure.memory import MemoryTracker
from harness.run import run_job


def test_tracker_on_cpu_leaves_nvml_empty_and_says_why():
    with MemoryTracker("cpu") as t:
        block = bytearray(64 * 2**20)  # RSS grows while tracked
        time.sleep(0.05)
    r = t.report
    assert r.nvml_used_bytes is None and r.nvml_process_bytes is None and r.torch_allocated_bytes is None
    assert "NVML" in r.notes and r.rss_bytes > 64 * 2**20 and r.samples >= 2
    del block


def _fake_pynvml(used_values: list[int], proc_bytes: int) -> types.ModuleType:
    nv = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    state = {"i": 0}

    def memory_info(handle):
        i = min(state["i"], len(used_values) - 1)
        state["i"] += 1
        return types.SimpleNamespace(used=used_values[i], total=10**12)

    nv.NVMLError = NVMLError
    nv.nvmlInit = lambda: None
    nv.nvmlDeviceGetHandleByIndex = lambda i: "h0"
    nv.nvmlDeviceGetMemoryInfo = memory_info
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        types.SimpleNamespace(pid=1, usedGpuMemory=5), types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=proc_bytes)]
    nv.nvmlSystemGetDriverVersion = lambda: "999.1"
    return nv


def test_tracker_with_mocked_nvml_reports_peaks(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml([100, 700, 300], proc_bytes=4096))
    with MemoryTracker("cpu", interval_s=0.001) as t:
        time.sleep(0.05)
    r = t.report
    assert r.nvml_baseline_bytes == 100 and r.nvml_used_bytes == 700  # the peak, not the last sample
    assert r.nvml_process_bytes == 4096  # this process's entry, not the other one
    assert "NVML" not in (r.notes or "")


def test_max_concurrency_search_matches_the_analytic_figure(compose, tmp_path):
    overrides = ["scenario=max_concurrency", "model=tiny-llama", "max_seq_len=64", "workload=fixed",
                 "workload.prompt_len=30", "workload.output_len=10", "device.kv_cache_gb=0.0025",
                 "device.watermark=0"]
    for impl in ("contiguous", "paged_torch"):
        rows, code = run_job(compose([f"+impl={impl}", *overrides]), tmp_path / impl)
        assert code == 0, rows[0].get("error")
        row = rows[0]
        assert row["max_concurrency"] > 1 and row["probes"] > 2
        assert abs(row["max_concurrency"] - row["max_concurrency_analytic"]) <= 1, row


def test_kernel_scenario_rows(compose, tmp_path):
    rows, code = run_job(compose(["scenario=kernel", "scenario.batches=[2]", "scenario.contexts=[40]",
                                  "scenario.block_sizes=[8]", "scenario.num_heads=4", "scenario.num_kv_heads=2",
                                  "scenario.head_dim=64", "scenario.iters=2", "scenario.warmup=1"]), tmp_path)
    assert code == 0
    by = {(r["impl"], r["layout"]): r for r in rows}
    assert set(by) == {("contiguous", "contiguous"), ("paged_torch", "paged"), ("paged_torch", "contiguous"),
                       ("paged_triton", "paged"), ("paged_triton", "contiguous"), ("paged_cuda", "paged"),
                       ("paged_cuda", "contiguous")}
    for r in rows:
        assert r["status"] == "ok", r
        assert r["max_abs_err"] < 1e-4 and r["latency_us_p50"] > 0
        assert r["bandwidth_gbps"] == pytest.approx(r["bytes_moved"] / (r["latency_us_p50"] * 1e-6) / 1e9)
        assert r["copy_bw_gbps"] > 0 and r["peak_bw_gbps"] is None


def test_repeat_reports_median_and_spread(compose, tmp_path):
    rows, code = run_job(compose(["+impl=paged_torch", "repeat=3", "model=tiny-llama", "max_seq_len=64",
                                  "workload.num_requests=2", "workload.prompt_len=8", "workload.output_len=4"]),
                         tmp_path)
    assert code == 0
    row = rows[0]
    assert row["tokens_per_s"] > 0 and row["tokens_per_s_spread"] is not None and row["tokens_per_s_spread"] >= 0
    assert "different tokens" not in (row["notes"] or "")  # the repeats generated the same tokens
