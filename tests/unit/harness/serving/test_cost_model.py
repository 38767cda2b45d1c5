"""The simulated clock's formulas (harness/serving/cost_model.py) on steps worked out by hand."""

from __future__ import annotations

import pytest

from harness.serving.cost_model import CostModel, GpuSpec, ModelCost
from harness.errors import ConfigError

# 1 GFLOP-per-token model: 1e9 parameters, 2 GB of weights, 100 kB of KV per token.
MODEL = ModelCost(params=10**9, weight_bytes=2 * 10**9, kv_bytes_per_token=10**5, num_layers=4, hidden_size=512,
                  elem_bytes=2)
FIGURES = dict(memory_gb=80, bandwidth_gbps=1000, tflops=100, bw_efficiency=0.5, flops_efficiency=0.5,
               step_overhead_us=100, interconnect_gbps=50, interconnect_latency_us=5)


def clock(count: int = 1, **changes) -> CostModel:
    return CostModel(GpuSpec("hand", **{**FIGURES, **changes}, count=count), MODEL)


def test_one_gpu_steps_by_hand():
    c = clock()
    # 1000 GB/s x 0.5 = 5e11 B/s; 100 TFLOP/s x 0.5 = 5e13 FLOP/s; overhead 1e-4 s.
    # Decode, 8 sequences reading 10,000 KV tokens: (2e9 + 1e4 * 1e5) / 5e11 = 6e-3 s of memory
    # against 2 * 1e9 * 8 / 5e13 = 3.2e-4 s of compute: memory-bound.
    assert c.decode_s(8, 10_000) == pytest.approx(6e-3 + 1e-4, rel=1e-12)
    # Decode, 1000 sequences with no context: 2e9 / 5e11 = 4e-3 s against 2e12 / 5e13 = 4e-2 s: compute-bound.
    assert c.decode_s(1000, 0) == pytest.approx(4e-2 + 1e-4, rel=1e-12)
    # Prefill of 1000 tokens: 2 * 1e9 * 1000 / 5e13 = 4e-2 s of compute against 4e-3 s of weights.
    assert c.prefill_s(1000) == pytest.approx(4e-2 + 1e-4, rel=1e-12)
    # Prefill of 10 tokens: 4e-4 s of compute, so the weights' 4e-3 s set the pace.
    assert c.prefill_s(10) == pytest.approx(4e-3 + 1e-4, rel=1e-12)
    assert c.comm_s(8) == 0


def test_tensor_parallel_step_by_hand():
    c = clock(count=4)
    # 4 GPUs: 2e12 B/s and 2e14 FLOP/s. Each of 2 * 4 layers all-reduces 8 * 512 * 2 = 8192 bytes:
    # 5e-6 s + 2 * 3/4 * 8192 / 5e10 s = 5.24576e-6 s, so 4.196608e-5 s per step.
    assert c.comm_s(8) == pytest.approx(4.196608e-5, rel=1e-12)
    # Memory 3e9 / 2e12 = 1.5e-3 s (compute 8e-5 s) + overhead + communication.
    assert c.decode_s(8, 10_000) == pytest.approx(1.5e-3 + 1e-4 + 4.196608e-5, rel=1e-12)


def test_a_decode_jump_is_the_sum_of_its_steps():
    c = clock()
    # 1000 sequences, 170,000 KV tokens: memory 0.038 s, compute 0.04 s; each step reads 1000 more
    # tokens (+2e-4 s), so steps 0-9 are compute-bound and 10-24 memory-bound:
    # 10 * 0.04 + 15 * 0.038 + 2e-4 * (10 + ... + 24) + 25 * 1e-4 = 1.0235 s.
    assert c.decode_s(1000, 170_000, steps=25) == pytest.approx(1.0235, rel=1e-12)
    for batch, kv, steps in [(1000, 170_000, 25), (3, 0, 1), (3, 5, 40), (5000, 0, 7), (1, 10**7, 3)]:
        one_by_one = sum(c.decode_s(batch, kv + j * batch) for j in range(steps))
        assert c.decode_s(batch, kv, steps) == pytest.approx(one_by_one, rel=1e-12)
    with pytest.raises(ValueError):
        c.decode_s(8, 0, steps=0)


@pytest.mark.parametrize("key,value", [("bandwidth_gbps", 0), ("tflops", -1), ("memory_gb", 0),
                                       ("bw_efficiency", 0), ("flops_efficiency", 1.5),
                                       ("interconnect_gbps", 0), ("step_overhead_us", -1),
                                       ("interconnect_latency_us", -0.5)])
def test_a_figure_out_of_range_names_its_key(key, value):
    with pytest.raises(ConfigError, match=rf"^gpu\.{key}={value}"):
        clock(**{key: value})


def test_zero_overhead_and_latency_are_allowed():
    c = clock(count=2, step_overhead_us=0, interconnect_latency_us=0)
    assert c.decode_s(8, 10_000) == pytest.approx(3e9 / 1e12 + 2 * 4 * (8 * 512 * 2) / 5e10, rel=1e-12)
