"""The simulated clock's formulas (harness/serving/cost_model.py, roofline version 8) on steps worked out by hand.

``clock()`` leaves the version-2 terms at their neutral defaults (no per-layer cost, attention at the
weights' rate, a sharp roofline: max of a matmul's read and its FLOPs, no copy measurement); each term has a test
of its own."""

from __future__ import annotations

import pytest

from kvbench.harness.serving.cost_model import CostModel, GpuSpec, ModelCost
from kvbench.harness.serving.engine_profile import EngineSpec
from kvbench.harness.errors import ConfigError

# 1 GFLOP-per-token model: 1e9 parameters, 2 GB of weights, 100 kB of KV per token.
MODEL = ModelCost(params=10**9, weight_bytes=2 * 10**9, kv_bytes_per_token=10**5, num_layers=4, hidden_size=512,
                  elem_bytes=2)
FIGURES = dict(memory_mib=80_000, bandwidth_gbps=1000, tflops=100, bw_efficiency=0.5, flops_efficiency=0.5,
               interconnect_gbps=50, interconnect_latency_us=5)
ENGINE = dict(step_overhead_us=100)  # the engine's figures (version 6): in series, no per-sequence cost


def clock(count: int = 1, **changes) -> CostModel:
    engine = {k: changes.pop(k) for k in ("step_overhead_us", "layer_overhead_us", "gemm_knee") if k in changes}
    return CostModel(GpuSpec("hand", **{**FIGURES, **changes}, count=count), MODEL,
                     engine=EngineSpec("hand", **{**ENGINE, **engine}))


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
    c = clock(attn_bw_efficiency=0.5, layer_overhead_us=10)
    # 1000 sequences, 170,000 KV tokens: compute 0.04 s beats the weights' 0.004 s; attention reads
    # 1.7e10 B at 2.5e11 B/s = 0.068 s, and each step 1000 tokens more (+4e-4 s); fixed 1e-4 + 4 * 1e-5 s:
    # 25 * (0.04 + 0.068 + 1.4e-4) + 4e-4 * (0 + 1 + ... + 24) = 2.7035 + 0.12 = 2.8235 s.
    assert c.decode_s(1000, 170_000, steps=25) == pytest.approx(2.8235, rel=1e-12)
    for batch, kv, steps in [(1000, 170_000, 25), (3, 0, 1), (3, 5, 40), (5000, 0, 7), (1, 10**7, 3)]:
        one_by_one = sum(c.decode_s(batch, kv + j * batch) for j in range(steps))
        assert c.decode_s(batch, kv, steps) == pytest.approx(one_by_one, rel=1e-12)
        # each step's own price, as the simulator's gaps read them: the same steps, one by one
        each = c.decode_steps_s(batch, kv, steps)
        assert each == pytest.approx([c.decode_s(batch, kv + j * batch) for j in range(steps)], rel=1e-12)
        assert c.decode_price_s(batch, kv, steps) == c.decode_s(batch, kv, steps)
    with pytest.raises(ValueError):
        c.decode_s(8, 0, steps=0)


def test_attention_is_a_term_of_its_own_at_its_own_efficiency():
    c = clock(attn_bw_efficiency=0.5)
    # Memory-bound: weights 2e9 / 5e11 = 4e-3 s, then the KV read 1e9 B at 5e11 * 0.5 = 4e-3 s.
    assert c.decode_s(8, 10_000) == pytest.approx(1e-4 + 4e-3 + 4e-3, rel=1e-12)
    # Compute-bound (1000 sequences: 0.04 s of matmuls): version 1 hid the KV read under the compute
    # (max(0.004 + 0.002, 0.04)); its own kernels add it: 0.04 + 1e9 / 2.5e11.
    assert c.decode_s(1000, 10_000) == pytest.approx(1e-4 + 4e-2 + 4e-3, rel=1e-12)
    assert c.attention_s(10_000) == pytest.approx(4e-3, rel=1e-12)
    # It grows with the tokens read, at any batch; the weights' read does not.
    assert c.decode_s(8, 20_000) - c.decode_s(8, 10_000) == pytest.approx(4e-3, rel=1e-12)


def test_the_per_layer_cost_does_not_vanish_at_small_batch():
    base, layered = clock(), clock(layer_overhead_us=25)  # 4 layers x 25 us = 1e-4 s per step
    for batch, kv in [(1, 1), (8, 10_000), (1000, 0)]:
        assert layered.decode_s(batch, kv) - base.decode_s(batch, kv) == pytest.approx(1e-4, rel=1e-9)
    assert layered.prefill_s(10) - base.prefill_s(10) == pytest.approx(1e-4, rel=1e-9)
    # Tensor parallelism splits the bytes and FLOPs but every GPU still runs every layer.
    assert (clock(count=4, layer_overhead_us=25).decode_s(1, 1) - clock(count=4).decode_s(1, 1)
            == pytest.approx(1e-4, rel=1e-9))


def test_the_knee_adds_the_read_and_the_flops_near_the_ridge_and_leaves_the_far_sides_alone():
    sharp, soft, added = clock(), clock(gemm_knee=1.5), clock(gemm_knee=1)
    # 100 tokens: 4e-3 s of weight read and 4e-3 s of FLOPs (the ridge): max, 2^(2/3) of it at p = 1.5, the sum at 1.
    assert sharp.prefill_s(100) == pytest.approx(4e-3 + 1e-4, rel=1e-12)
    assert soft.prefill_s(100) == pytest.approx(2 ** (2 / 3) * 4e-3 + 1e-4, rel=1e-12)
    assert added.prefill_s(100) == pytest.approx(8e-3 + 1e-4, rel=1e-12)
    # Far from the ridge the larger term sets the pace whatever the knee: 10,000 tokens' 0.4 s of FLOPs, 1 token's read.
    for tokens in (1, 10_000):
        assert soft.prefill_s(tokens) == pytest.approx(sharp.prefill_s(tokens), rel=0.01)
    # Decode too: 100 sequences with no context sit on the ridge.
    assert soft.decode_s(100, 0) == pytest.approx(2 ** (2 / 3) * 4e-3 + 1e-4, rel=1e-12)
    assert soft.decode_s(100, 0) > sharp.decode_s(100, 0)
    # A step's price never falls as its tokens grow, at any knee.
    for c in (sharp, soft, added):
        prices = [c.prefill_s(t) for t in range(1, 400, 7)]
        assert prices == sorted(prices)


def test_a_measured_copy_bandwidth_replaces_the_datasheet_times_efficiency():
    assert clock().bytes_per_s == pytest.approx(1000e9 * 0.5)  # no measurement: bandwidth x bw_efficiency
    measured = clock(copy_bandwidth_gbps=800, attn_bw_efficiency=0.5)
    assert measured.bytes_per_s == pytest.approx(800e9) and measured.attn_bytes_per_s == pytest.approx(400e9)
    assert clock(count=2, copy_bandwidth_gbps=800).bytes_per_s == pytest.approx(1600e9)
    # The weights' read runs at the copy rate whatever bw_efficiency says.
    assert clock(copy_bandwidth_gbps=800, bw_efficiency=0.1).decode_s(8, 0) == pytest.approx(
        clock(copy_bandwidth_gbps=800).decode_s(8, 0), rel=1e-12)
    assert measured.decode_s(1, 0) == pytest.approx(1e-4 + 2e9 / 800e9, rel=1e-12)


@pytest.mark.parametrize("key,value", [("bandwidth_gbps", 0), ("tflops", -1), ("memory_mib", 0),
                                       ("bw_efficiency", 0), ("flops_efficiency", 1.5),
                                       ("interconnect_gbps", 0),
                                       ("interconnect_latency_us", -0.5), ("attn_bw_efficiency", 0),
                                       ("attn_bw_efficiency", 1.2),
                                       ("copy_bandwidth_gbps", 0),
                                       ("fp8_tflops", 0)])
def test_a_figure_out_of_range_names_its_key(key, value):
    with pytest.raises(ConfigError, match=rf"^gpu\.{key}={value}"):
        clock(**{key: value})


def test_zero_overhead_and_latency_are_allowed():
    c = clock(count=2, step_overhead_us=0, interconnect_latency_us=0)
    assert c.decode_s(8, 10_000) == pytest.approx(3e9 / 1e12 + 2 * 4 * (8 * 512 * 2) / 5e10, rel=1e-12)


def test_host_copies_by_hand():
    """S stores and D loads of b tokens: T transfers of 2*L*hlat plus (S + D) * b*kvb / (n*hlink) bytes' time."""
    per_block = CostModel(clock(host_link_gbps=50, host_link_latency_us=5).gpu, MODEL, per_block=True)
    # 3 blocks of 16 tokens, 4 layers, a transfer per block: 3 * (8 * 5e-6 + 16 * 1e5 / 50e9)
    assert per_block.host_copy_s(1, 2, 16) == pytest.approx(3 * (8 * 5e-6 + 16e5 / 50e9))
    two = CostModel(clock(2, host_link_gbps=50, host_link_latency_us=5).gpu, MODEL, per_block=True)
    assert two.host_copy_s(3, 0, 16) == pytest.approx(3 * (8 * 5e-6 + 16e5 / 100e9))  # each GPU: its half
    assert per_block.host_copy_s(0, 0, 16) == 0.0
    # The same tokens in blocks of 8 cost more than in blocks of 128: only the latency differs.
    assert per_block.host_copy_s(0, 16, 8) > per_block.host_copy_s(0, 1, 128)
    # Batched (the default): one transfer per direction, whatever the blocks; the bytes are the same.
    batched = clock(host_link_gbps=50, host_link_latency_us=5)
    assert batched.host_copy_s(1, 2, 16) == pytest.approx(2 * 8 * 5e-6 + 3 * 16e5 / 50e9)
    assert batched.host_copy_s(0, 3, 16) == pytest.approx(8 * 5e-6 + 3 * 16e5 / 50e9)
    assert batched.host_copy_s(0, 16, 8) == pytest.approx(batched.host_copy_s(0, 1, 128))


def test_host_copies_need_a_host_link():
    with pytest.raises(ConfigError, match="host_link_gbps"):
        clock().host_copy_s(1, 0, 16)
    with pytest.raises(ConfigError, match="host_link_gbps"):
        clock(host_link_gbps=0)


def test_a_mixed_step_reads_the_weights_once_for_its_chunk_and_its_decodes():
    c = clock(gemm_knee=1.5)
    assert c.mixed_s(300, 0, 0) == pytest.approx(c.prefill_s(300), rel=1e-12)
    assert c.mixed_s(0, 8, 10_000) == pytest.approx(c.decode_s(8, 10_000), rel=1e-12)
    assert c.mixed_s(0, 0, 0) == 0.0
    # 2000 chunk tokens + 8 decodes: compute-bound, 2 * 1e9 * 2008 / 5e13 (on the knee: with 4e-3 s of read), plus
    # the decodes' KV read at 5e11 B/s.
    mm = ((2 * 1e9 * 2008 / 5e13) ** 1.5 + 4e-3**1.5) ** (1 / 1.5)
    assert c.mixed_s(2000, 8, 10_000) == pytest.approx(mm + 1e4 * 1e5 / 5e11 + 1e-4, rel=1e-12)
    # A small chunk: one weight read (on the knee with the 18 rows' FLOPs) serves both halves.
    assert c.mixed_s(10, 8, 0) == pytest.approx(((2 * 1e9 * 18 / 5e13) ** 1.5 + 4e-3**1.5) ** (1 / 1.5) + 1e-4,
                                                 rel=1e-12)
    assert c.mixed_s(10, 8, 10_000) < c.prefill_s(10) + c.decode_s(8, 10_000)
    tp = clock(count=4)  # tensor parallel: the all-reduces carry the chunk's rows and the decodes'
    assert tp.mixed_s(10, 8, 0) - tp.prefill_s(10) == pytest.approx(tp.comm_s(18) - tp.comm_s(10), rel=1e-9)
