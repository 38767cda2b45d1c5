"""Engine profiles on the simulated clock (harness/serving/engine_profile.py, roofline version 6): each term on steps
worked out by hand: host and device in series, async scheduling's max, multi-step's amortization, the per-sequence
cost, and the front-end cost that only an online run's requests pay."""

from __future__ import annotations

import pytest

from kvbench.harness.errors import ConfigError
from kvbench.harness.serving.cost_model import CostModel, GpuSpec, ModelCost
from kvbench.harness.serving.engine_profile import EngineSpec

# 2 GB of weights at 5e11 B/s: 4e-3 s a weight read; 100 kB of KV a token at 5e11 B/s: 2e-7 s a token; 4 layers.
MODEL = ModelCost(params=10**9, weight_bytes=2 * 10**9, kv_bytes_per_token=10**5, num_layers=4, hidden_size=512,
                  elem_bytes=2)
GPU = GpuSpec("hand", memory_mib=80_000, bandwidth_gbps=1000, tflops=100, bw_efficiency=0.5, flops_efficiency=0.5,
              interconnect_gbps=50, interconnect_latency_us=5)


def clock(**engine) -> CostModel:
    return CostModel(GPU, MODEL, engine=EngineSpec("hand", **engine))


def test_a_neutral_engine_adds_nothing():
    # Device alone: 4e-3 s of weights + 10,000 tokens x 2e-7 s = 6e-3 s.
    assert clock().decode_s(8, 10_000) == pytest.approx(6e-3, rel=1e-12)
    assert clock().frontend_s == 0


def test_host_and_device_in_series():
    c = clock(step_overhead_us=1000, seq_overhead_us=10, layer_overhead_us=25)
    # host: 1e-3 + 8 x 1e-5 = 1.08e-3 s; device: 4 x 25e-6 = 1e-4 s of layers + 6e-3 s = 6.1e-3 s.
    assert c.decode_s(8, 10_000) == pytest.approx(1.08e-3 + 6.1e-3, rel=1e-12)
    # A prefill of 10 tokens (one prompt): host 1e-3 + 1e-5; device 1e-4 + the weights' 4e-3 (compute 4e-4 s).
    assert c.prefill_s(10) == pytest.approx(1.01e-3 + 4.1e-3, rel=1e-12)
    # A mixed step of 10 prompt tokens and 8 decodes: host counts 9 sequences (the decodes and the prompt).
    assert c.mixed_s(10, 8, 10_000) == pytest.approx(1.09e-3 + 1e-4 + 4e-3 + 2e-3, rel=1e-12)


def test_the_per_sequence_cost_grows_with_the_batch():
    with_seq, without = clock(seq_overhead_us=10), clock()
    for batch in (1, 8, 64, 256):
        assert with_seq.decode_s(batch, 0) - without.decode_s(batch, 0) == pytest.approx(batch * 1e-5, rel=1e-9)


def test_async_scheduling_prices_the_longer_of_host_and_device():
    sync = clock(step_overhead_us=5000)
    overlapped = clock(step_overhead_us=5000, async_scheduling=True)
    # Device 4e-3 + R x 2e-7 s; host 5e-3 s. R = 0: the host sets the pace; R = 10,000: the device (6e-3 s).
    assert overlapped.decode_s(1, 0) == pytest.approx(5e-3, rel=1e-12)
    assert sync.decode_s(1, 0) == pytest.approx(9e-3, rel=1e-12)
    assert overlapped.decode_s(1, 10_000) == pytest.approx(6e-3, rel=1e-12)
    assert overlapped.prefill_s(10) == pytest.approx(5e-3, rel=1e-12)  # 4e-3 s of weights under 5e-3 of host


def test_an_async_jump_is_the_sum_of_its_steps():
    # 1000 sequences: each step reads 1000 tokens more (+2e-4 s). From R = 0 the device's 4e-3 + ... is compute:
    # 2e12 / 5e13 = 0.04 s a step; use a host above it for the first steps: 0.041 s.
    c = clock(step_overhead_us=41_000, async_scheduling=True)
    for batch, kv, steps in [(1000, 0, 25), (1, 0, 7), (8, 4_000, 40), (1000, 170_000, 3), (3, 0, 1)]:
        one_by_one = [c.decode_s(batch, kv + j * batch) for j in range(steps)]
        assert c.decode_s(batch, kv, steps) == pytest.approx(sum(one_by_one), rel=1e-12)
        assert c.decode_steps_s(batch, kv, steps) == pytest.approx(one_by_one, rel=1e-12)
    # 1000 sequences from R = 0: steps 0..4 are host-bound (0.04 + 2e-4 j < 0.041 for j < 5), the rest device-bound.
    expected = 5 * 0.041 + sum(0.04 + 2e-4 * j for j in range(5, 25))
    assert c.decode_s(1000, 0, 25) == pytest.approx(expected, rel=1e-12)


def test_multi_step_amortizes_the_host_over_k_decode_steps():
    one, ten = clock(step_overhead_us=2000, seq_overhead_us=20), clock(step_overhead_us=2000, seq_overhead_us=20,
                                                                        scheduler_steps=10)
    # host 2e-3 + 8 x 2e-5 = 2.16e-3 s a pass; over 10 steps, 2.16e-4 s a step.
    assert one.decode_s(8, 10_000) - ten.decode_s(8, 10_000) == pytest.approx(2.16e-3 - 2.16e-4, rel=1e-9)
    assert ten.decode_s(8, 0) == pytest.approx(2.16e-4 + 4e-3, rel=1e-12)
    # A step that computes prompts runs alone: its whole pass.
    assert ten.prefill_s(10) == one.prefill_s(10) == pytest.approx(2.02e-3 + 4e-3, rel=1e-12)


def test_the_front_end_cost_is_an_online_requests_only():
    assert EngineSpec(frontend_ms=19, offline=False).frontend_s == pytest.approx(0.019)
    assert EngineSpec(frontend_ms=19, offline=True).frontend_s == 0
    assert clock(frontend_ms=19, offline=False).frontend_s == pytest.approx(0.019)
    # It is no step's: the steps' prices do not move.
    assert clock(frontend_ms=19, offline=False).decode_s(8, 100) == clock().decode_s(8, 100)


@pytest.mark.parametrize("key,value,allowed", [
    ("step_overhead_us", -1, r"\[0, 100000\]"), ("seq_overhead_us", 20_000, r"\[0, 10000\]"),
    ("layer_overhead_us", float("nan"), r"\[0, 10000\]"), ("frontend_ms", -0.5, r"\[0, 10000\]"),
    ("scheduler_steps", 0, r"\[1, 256\]"), ("scheduler_steps", 2.5, r"\[1, 256\]"),
    ("async_scheduling", "yes", "true or false")])
def test_a_figure_out_of_range_names_its_key_and_range(key, value, allowed):
    with pytest.raises(ConfigError, match=rf"^engine\.{key}={value} must .*{allowed}.*\(engine=hand\)"):
        EngineSpec("hand", **{key: value})


@pytest.mark.parametrize("value", [0.5, float("inf"), "soft", True])
def test_a_knee_below_one_or_not_a_finite_number_is_refused(value):
    with pytest.raises(ConfigError, match=rf"^engine\.gemm_knee={value} must be a finite number >= 1.*\(engine=hand\)"):
        EngineSpec("hand", gemm_knee=value)


def test_the_shipped_engines_knees():
    from kvbench.harness.front.groups import load_group
    from kvbench.harness.config import EngineConfig
    knees = {name: load_group("engine", name, EngineConfig).gemm_knee for name in ("vllm_v1", "vllm_v0", "sglang",
                                                                                    "trtllm")}
    assert knees == {"vllm_v1": 2, "vllm_v0": 2, "sglang": 2, "trtllm": 2}


@pytest.mark.parametrize("value", [0, -700, float("inf"), "wide", True])
def test_an_expert_width_that_is_not_a_positive_number_is_refused(value):
    with pytest.raises(ConfigError, match=rf"^engine\.moe_gemm_half_n={value} must be a finite number > 0.*null"):
        EngineSpec("hand", moe_gemm_half_n=value)


def test_the_experts_rate_grows_with_their_width():
    engine = EngineSpec("hand", moe_gemm_half_n=700)
    assert engine.expert_rate(700) == 0.5 and engine.expert_rate(7000) == pytest.approx(10 / 11)
    assert EngineSpec("hand").expert_rate(768) == 1.0 and engine.expert_rate(0) == 1.0  # null; a dense model
