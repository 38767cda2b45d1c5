"""Which clock prices a run (harness/serving/clocks.py), and what a clock may not change: with every
request there at t=0 (no arrivals to interleave), the cost terms price the steps but leave every
byte and concurrency figure of a capacity row as it is, with no clock at all included."""

from __future__ import annotations

import pytest

from kvbench.harness.front.job import run_job
from kvbench.harness.front.resolve import resolve
from kvbench.harness.serving.clocks import ROOFLINE, step_clock
from kvbench.harness.serving.cost_model import CostModel

SETUP = ["+impl=paged_torch", "scenario=capacity", "model=llama-2-13b", "max_seq_len=2048", "batch=64",
         "workload=sharegpt", "workload.num_requests=150", "timeline_tables=false", "chunked_prefill=false"]
# Version 2's terms set to their neutral values: version 1's prices where decode is memory-bound.
NEUTRAL = ["gpu.attn_bw_efficiency=1", "engine=vllm_v1", "engine.layer_overhead_us=0", "engine.gemm_knee=1000"]  # ~max
BYTES_AND_COUNTS = ("kv_bytes_per_token", "kv_pool_bytes", "kv_bytes_reserved", "kv_bytes_used", "kv_bytes_logical",
                    "kv_fragmentation_bytes", "kv_reservation_waste_bytes", "weight_bytes", "budget_kv_bytes",
                    "max_concurrency", "max_concurrency_analytic", "peak_concurrency", "preemptions",
                    "output_tokens", "prompt_tokens", "decode_steps")


def test_gpu_name_gives_the_roofline(compose):
    clock, name = step_clock(resolve(compose(SETUP + ["gpu=a100-40gb"])), "paged_torch")
    assert isinstance(clock, CostModel) and name == ROOFLINE == "roofline-v11"
    assert clock.engine.layer_overhead_us == 30 and clock.gpu.copy_bandwidth_gbps is None
    assert clock.engine.name == "vllm_v1"  # gpu=NAME and no engine: the default engine
    assert step_clock(resolve(compose(SETUP + ["device.memory_gb=40"])), "paged_torch") == (None, None)


def test_cost_terms_move_the_clock_but_no_byte_or_concurrency(compose, tmp_path):
    rows = {}
    for label, extra in [("v2", ["gpu=a100-40gb"]), ("neutral", ["gpu=a100-40gb", *NEUTRAL]),
                         ("no clock", ["device.memory_gb=42.94967296", "dtype=bfloat16"])]:  # 40960 MiB
        (row,), code = run_job(compose(SETUP + extra), tmp_path / label.replace(" ", "_"))
        assert code == 0, row.get("error")
        rows[label] = row
    for key in BYTES_AND_COUNTS:
        assert rows["v2"][key] == rows["neutral"][key] == rows["no clock"][key], key
    assert rows["v2"]["peak_concurrency"] > 1 and rows["v2"]["kv_bytes_used"] > 0
    # The clock did move: the terms make every step dearer.
    assert rows["v2"]["duration_s"] > rows["neutral"]["duration_s"] * 1.05
    assert rows["no clock"].get("duration_s") is None
    assert rows["v2"]["clock_source"] == ROOFLINE and rows["no clock"].get("clock_source") is None
