"""A decode row at a quantized kv_dtype whose accuracy was not measured says so in its notes."""

from __future__ import annotations

import pytest

from kvbench.harness.front.job import run_job
from kvbench.kernels.kv_formats import KV_FORMATS

# The smallest run the kv_dtype accuracy tests use (tests/unit/harness/serving/test_kv_accuracy.py).
TINY = ["progress=false", "device=cpu", "dtype=float32", "max_seq_len=96", "batch=4", "scenario.warmup=0",
        "cpu_threads=1", "+impl=paged_torch", "model=tiny-llama", "workload=uniform", "workload.num_requests=2",
        "workload.prompt_len=8", "workload.output_len=3"]
UNCHECKED = "the quantized KV cache's accuracy was not checked"


def _row(compose, tmp_path, overrides: list[str]) -> dict:
    rows, code = run_job(compose([*TINY, *overrides]), tmp_path)
    assert code == 0, [r.get("error") for r in rows]
    (row,) = rows
    assert row["status"] == "ok", row.get("error")
    return row


@pytest.mark.parametrize("kv_dtype", list(KV_FORMATS))  # every quantized store, fp8 variants and int8
def test_a_quantized_row_with_accuracy_off_says_it_was_not_checked(compose, tmp_path, kv_dtype):
    row = _row(compose, tmp_path, [f"kv_dtype={kv_dtype}", "scenario.accuracy=false"])
    assert f"kv_dtype={kv_dtype}: {UNCHECKED} (scenario.accuracy=false)" in row["notes"]
    assert row.get("kv_top1_agreement") is None and row.get("kv_accuracy_gate") is None


def test_the_full_precision_cache_has_nothing_to_check_and_parallel_samples_say_why_not(compose, tmp_path):
    auto = _row(compose, tmp_path / "auto", ["scenario.accuracy=false"])
    assert UNCHECKED not in (auto["notes"] or "")
    # accuracy on, but the check compares one sequence per request: the quantized row says it went unchecked
    sampled = _row(compose, tmp_path / "n2", ["kv_dtype=int8", "workload.n=2"])
    assert f"kv_dtype=int8: {UNCHECKED} (workload.n=2: it compares one sequence per request)" in sampled["notes"]
    assert sampled.get("kv_top1_agreement") is None
