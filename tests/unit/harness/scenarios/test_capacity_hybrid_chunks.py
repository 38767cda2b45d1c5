"""Issue 44's capacity answer under kv_manager=hybrid, chunk by chunk: with chunked prefill a grouped pool
reserves a prompt's first chunk and grows one chunk a step (harness/serving/scheduler.py), so a sliding group
never holds a 32K prompt's every block, and the simulated max concurrency of 32K-token requests in 80 GB meets
the analytic figure (what each sequence holds once written: impls/kinds.py ``max_concurrency``) within one
sequence. Admitting every prompt whole held Gemma-3-27B at 20 of its 25."""

from __future__ import annotations

import pytest

from kvbench.harness.front.job import run_job

BASE = ["scenario=capacity", "dtype=bfloat16", "max_seq_len=32768", "batch=256", "workload=fixed",
        "workload.prompt_len=32368", "workload.output_len=400", "device.memory_gb=80", "device.kv_cache_gb=80",
        "+impl=paged_torch", "impl.prefix_caching=false", "kv_manager=hybrid", "chunked_prefill=true",
        "max_num_batched_tokens=8192", "scenario.concurrency_points=[1]", "timeline_tables=false"]


@pytest.mark.parametrize("model,requests,analytic", [("gemma-3-27b", 40, 25), ("gpt-oss-120b", 90, 65)])
def test_simulated_max_concurrency_meets_the_analytic_figure(compose, tmp_path, model, requests, analytic):
    rows, code = run_job(compose([*BASE, f"model={model}", f"workload.num_requests={requests}"]), tmp_path)
    assert code == 0, rows[0].get("error")
    row = rows[0]
    assert row["max_concurrency_analytic"] == analytic
    assert abs(row["max_concurrency"] - analytic) <= 1, row["max_concurrency"]
