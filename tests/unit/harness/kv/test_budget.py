"""Bounded budgets: finite values at most the device, a KV pool that fits in RAM on CPU,
out-of-memory failures as status=oom, and a note when the budget capped concurrency."""

from __future__ import annotations

import pytest

from kvbench.harness.kv.budget import (
    MAX_SIMULATED_GB, budget_limit_note, check_host_pool, check_memory_bounds, kv_budget, out_of_memory_message,
)
from kvbench.harness.errors import ConfigError
from kvbench.harness.front.resolve import resolve
from kvbench.harness.front.job import run_job

GPU_80GB = 80 * 10**9
TINY_DECODE = ["+impl=paged_torch", "model=tiny-llama", "max_seq_len=32", "workload=fixed", "workload.prompt_len=8",
               "workload.output_len=2", "scenario.warmup=0"]


@pytest.mark.parametrize("override, expected", [
    ("device.memory_gb=inf", "device.memory_gb=inf must be a finite number of GB > 0"),
    ("device.memory_gb=nan", "device.memory_gb=nan must be a finite number of GB > 0"),
    ("device.kv_cache_gb=-1", "device.kv_cache_gb=-1.0 must be a finite number of GB > 0"),
    ("device.memory_gb=1e6", f"device.memory_gb=1e+06 is larger than the largest simulated device; at most {MAX_SIMULATED_GB:g} GB"),
    ("device.kv_cache_gb=1e5", "device.kv_cache_gb=100000 is larger than the largest simulated device"),
])
def test_memory_values_are_finite_and_bounded(compose, override, expected):
    with pytest.raises(ConfigError, match="^" + expected.replace("+", r"\+").replace("(", r"\(").replace(")", r"\)")):
        resolve(compose(["scenario=capacity", override]))


def test_the_bound_is_the_gpu_when_the_run_allocates_on_it(compose):
    decode = resolve(compose(["device=cpu", "device.memory_gb=100"]))
    with pytest.raises(ConfigError, match=r"device.memory_gb=100 is larger than the GPU's memory; at most 80 GB"):
        check_memory_bounds(decode, GPU_80GB)
    capacity = resolve(compose(["scenario=capacity", "device.memory_gb=141"]))
    check_memory_bounds(capacity, GPU_80GB)  # bookkeeping only: a simulated 141 GB card is fine
    with pytest.raises(ConfigError, match="larger than the GPU"):
        kv_budget(decode, device_total_bytes=GPU_80GB)


def test_kv_cache_larger_than_the_device_is_an_error(compose):
    cfg = resolve(compose(["scenario=capacity", "device.memory_gb=1", "device.kv_cache_gb=2"]))
    with pytest.raises(ConfigError, match=r"device.kv_cache_gb=2 is larger than the device \(1 GB, from device.memory_gb\)"):
        kv_budget(cfg)


def test_a_too_small_kv_cache_advises_raising_kv_cache_gb(compose, tmp_path):
    rows, code = run_job(compose(["+impl=paged_torch", "scenario=capacity", "model=tiny-llama", "max_seq_len=512",
                                  "device.kv_cache_gb=0.0001"]), tmp_path)
    assert code == 2 and "raise device.kv_cache_gb" in rows[0]["error"] and "memory_gb" not in rows[0]["error"]


def test_host_pool_is_refused_above_a_share_of_free_ram():
    check_host_pool(4 * 10**9, free_ram_bytes=10 * 10**9)
    with pytest.raises(ConfigError, match=r"at most 50% of the free RAM \(5.00 of 10.00 GB\)"):
        check_host_pool(6 * 10**9, free_ram_bytes=10 * 10**9)


def test_cpu_decode_refuses_a_pool_beyond_the_ram(compose, tmp_path):
    rows, code = run_job(compose([*TINY_DECODE, "device=cpu", "device.memory_gb=2000"]), tmp_path)
    assert code == 2 and rows[0]["status"] == "error" and "free RAM" in rows[0]["error"]


def _no_model_may_be_built(monkeypatch):
    import kvbench.harness.model.weights as weights

    def refuse(*args, **kwargs):
        raise AssertionError("the model was built")

    monkeypatch.setattr(weights, "build_model", refuse)


def test_a_budget_the_weights_exceed_fails_before_they_are_built(compose, tmp_path, monkeypatch):
    """An 8B model on the default 0.25 GB CPU device: the analytic budget refuses it at once
    (before: 32 GB of fp32 weights were allocated and the OOM killer ended the run, no row)."""
    _no_model_may_be_built(monkeypatch)
    rows, code = run_job(compose(["+impl=paged_torch", "model=llama-3.1-8b", "device=cpu"]), tmp_path)
    assert code == 2 and rows[0]["status"] == "error"
    assert "leaves nothing for the KV cache: weights need 32.12 GB" in rows[0]["error"]


def test_weights_beyond_the_free_ram_are_refused_with_their_size(compose, tmp_path, monkeypatch):
    import psutil

    _no_model_may_be_built(monkeypatch)
    free = type("Mem", (), {"available": 10**6})()
    monkeypatch.setattr(psutil, "virtual_memory", lambda: free)
    rows, code = run_job(compose([*TINY_DECODE, "device=cpu"]), tmp_path)
    assert code == 2 and rows[0]["status"] == "error"
    assert "model=tiny-llama in dtype=float32 needs" in rows[0]["error"] and "of the free RAM" in rows[0]["error"]


def test_allocation_failures_are_oom_with_a_message():
    assert "out of host memory" in out_of_memory_message(MemoryError())
    cpu = RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried")
    assert out_of_memory_message(cpu).startswith("RuntimeError: [enforce fail")
    assert out_of_memory_message(ValueError("bad")) is None


def test_memory_error_in_a_run_becomes_status_oom(compose, tmp_path, monkeypatch):
    import kvbench.harness.scenarios.capacity as capacity

    def exhausted(job, impl):  # a scenario names the pieces it takes (harness/scenarios/context.py call)
        raise MemoryError()

    monkeypatch.setattr(capacity, "run", exhausted)
    rows, code = run_job(compose(["+impl=paged_torch", "scenario=capacity", "model=tiny-llama"]), tmp_path)
    assert rows[0]["status"] == "oom" and "out of host memory" in rows[0]["error"]


def test_budget_limit_note(compose):
    cfg = resolve(compose([*TINY_DECODE, "batch=8", "device.kv_cache_gb=0.001"]))
    assert budget_limit_note(cfg, 0, 40, peak_running=8, preemptions=0) is None  # batch limited, or all ran
    note = budget_limit_note(cfg, 30, 40, peak_running=2, preemptions=0)
    assert "at most 2 of the 8 sequences batch=8 allows" in note and "(30 of 40 decode steps)" in note
    assert "raise device.kv_cache_gb" in note
    assert "3 preemptions" in budget_limit_note(cfg, 0, 40, peak_running=8, preemptions=3)


def test_decode_row_says_when_the_budget_limited_concurrency(compose, tmp_path):
    # 65536 bytes per block (tiny-llama fp32, 16 tokens): room for two 10-token sequences.
    rows, code = run_job(compose([*TINY_DECODE, "device=cpu", "batch=6", "workload.num_requests=6",
                                  "device.kv_cache_gb=0.00014", "device.watermark=0"]), tmp_path)
    assert code == 0 and rows[0]["peak_concurrency"] == 2
    assert "the KV budget, not batch, limited concurrency: at most 2 of the 6" in rows[0]["notes"]
    rows, code = run_job(compose([*TINY_DECODE, "device=cpu", "batch=2", "workload.num_requests=6"]), tmp_path / "b")
    assert code == 0 and "KV budget" not in (rows[0]["notes"] or "")

