"""Roofline version 5's exact work (harness/serving/cost_model.py): FLOPs of the non-embedding parameters plus the LM
head per row of logits, no embedding table streamed per step, weights priced at ``weight_dtype``; worked by hand on
Llama-3.1-8B (8,030,261,248 parameters; vocab x hidden = 128,256 x 4,096 = 525,336,576, untied) and on the tied
Qwen2.5-0.5B (494,032,768 parameters; 151,936 x 896 = 136,134,656)."""

from __future__ import annotations

import dataclasses

import pytest

from kvbench.harness.config import GpuConfig
from kvbench.harness.errors import ConfigError
from kvbench.harness.front.groups import load_group
from kvbench.harness.front.resolve import resolve
from kvbench.harness.kv.sizes import stored_weight_bytes
from kvbench.harness.model.config import ModelConfig
from kvbench.harness.serving.cost_model import CostModel, cost_model_for, gpu_spec, model_cost
from kvbench.harness.serving.engine_profile import EngineSpec

P8B, T8B = 8_030_261_248, 525_336_576
P05, T05 = 494_032_768, 136_134_656


def _clock(gpu: str, model: str = "llama-3.1-8b", weight_dtype: str = "auto", ramp: bool = False) -> CostModel:
    # Version 5's host costs (o = 500 us, lo = 30 us, in series), the engine's since version 6, and version 8's one
    # FLOP efficiency of 0.6 at every size (ramp=False; the GPU file's by size since version 9): the figures below.
    spec = gpu_spec(load_group("gpu", gpu, GpuConfig))
    if not ramp:
        spec = dataclasses.replace(spec, flops_efficiency=0.6, flops_efficiency_small=None, flops_ramp_gflop=None,
                                   fp8_flops_efficiency=None)
    return CostModel(spec, model_cost(load_group("model", model, ModelConfig), "bfloat16", weight_dtype=weight_dtype),
                     engine=EngineSpec("v5", step_overhead_us=500, layer_overhead_us=30))


def test_an_untied_model_streams_no_embedding_and_counts_its_head_per_row():
    cost = _clock("h100-sxm").model
    assert (cost.params, cost.head_params, cost.tied_head) == (P8B, T8B, False)
    # Streamed: everything but the embedding table, 2 bytes each: 2 * (8,030,261,248 - 525,336,576).
    assert cost.weight_bytes == 2 * (P8B - T8B) == 15_009_849_344
    # A token multiplies by the 6,979,588,096 parameters between the lookup and the head; a row of logits by the head.
    assert cost.active_params == P8B - 2 * T8B == 6_979_588_096
    assert cost.flops(1024, 1) == 2 * 6_979_588_096 * 1024 + 2 * T8B


def test_a_tied_model_reads_its_table_once_as_the_head():
    cost = _clock("h100-sxm", "qwen2.5-0.5b").model
    assert cost.tied_head and cost.weight_bytes == 2 * P05  # the table is the LM head: read every step
    assert cost.active_params == P05 - T05 and cost.flops(10, 2) == 2 * (P05 - T05) * 10 + 2 * T05 * 2


def test_llama_8b_on_an_h100_by_hand():
    c = _clock("h100-sxm")  # 3350 GB/s x 0.8 = 2.68e12 B/s; 989 TFLOP/s x 0.6 = 5.934e14 FLOP/s
    fixed = 500e-6 + 32 * 30e-6  # o + L*lo = 1.46 ms
    # Batch 1: 15,009,849,344 B / 2.68e12 = 5.60069 ms of weights (version 4 streamed the table too: 5.99271 ms).
    assert c.decode_s(1, 0) == pytest.approx(fixed + 15_009_849_344 / 2.68e12, rel=1e-12)
    # Prefill of 1024 tokens, one prompt: (2 * 6,979,588,096 * 1024 + 2 * 525,336,576) / 5.934e14 = 24.0906 ms
    # (version 4: 2 * 8,030,261,248 * 1024 / 5.934e14 = 27.7156 ms, 15% more).
    assert c.prefill_s(1024) == pytest.approx(fixed + (2 * 6_979_588_096 * 1024 + 2 * T8B) / 5.934e14, rel=1e-12)
    assert c.prefill_s(1024, prompts=4) - c.prefill_s(1024) == pytest.approx(3 * 2 * T8B / 5.934e14, rel=1e-9)
    # A chunked step: the decodes' logits and one prompt's.
    assert c.mixed_s(2000, 8, 0) == pytest.approx(fixed + (2 * 6_979_588_096 * 2008 + 2 * T8B * 9) / 5.934e14,
                                                  rel=1e-12)


def test_fp8_weights_are_a_byte_a_value_and_compute_at_the_fp8_peak():
    m = load_group("model", "llama-3.1-8b", ModelConfig)
    # Stored: the layers at 1 byte, the embedding table and the LM head at 2.
    assert stored_weight_bytes(m, "bfloat16", "fp8") == (P8B - 2 * T8B) + 2 * 2 * T8B
    assert stored_weight_bytes(m, "bfloat16") == 2 * P8B  # auto: the run's dtype
    fp8, bf16 = _clock("h100-sxm", weight_dtype="fp8"), _clock("h100-sxm")
    # Streamed: the layers at 1 byte and the untied LM head at 2 (no embedding): 6,979,588,096 + 1,050,673,152.
    assert fp8.model.weight_bytes == (P8B - 2 * T8B) + 2 * T8B == 8_030_261_248
    assert fp8.flops_per_s == pytest.approx(1979e12 * 0.6) and bf16.flops_per_s == pytest.approx(989e12 * 0.6)
    fixed = 500e-6 + 32 * 30e-6
    assert fp8.decode_s(1, 0) == pytest.approx(fixed + 8_030_261_248 / 2.68e12, rel=1e-12)  # 4.46 ms vs 7.06 ms
    # An A100 has no fp8 tensor cores: the bytes halve, the compute stays at the bf16 peak (weight-only, W8A16).
    a100 = _clock("a100-80gb", weight_dtype="fp8")  # its copy rate: 1700 GB/s
    assert a100.flops_per_s == pytest.approx(312e12 * 0.6) and a100.model.weight_bytes == 8_030_261_248
    assert a100.decode_s(1, 0) == pytest.approx(500e-6 + 32 * 30e-6 + 8_030_261_248 / 1.7e12, rel=1e-12)

def test_the_flop_efficiency_grows_with_a_steps_work_by_hand():
    """Version 9: ef(g) = ef - (ef - ef0) * g0 / (g + g0), g a layer's GFLOP on one GPU (h100-sxm: 0.74, 0.1, 40)."""
    c = _clock("h100-sxm", ramp=True)
    fixed = 500e-6 + 32 * 30e-6
    flops = 2 * 6_979_588_096 * 1024 + 2 * T8B  # 1.4295e13: a layer's share is 446.7 GFLOP, ef = 0.6874
    ef = 0.74 - (0.74 - 0.1) * 40 / (flops / 32e9 + 40)
    assert ef == pytest.approx(0.6874, abs=1e-4)
    compute, weights = flops / (989e12 * ef), 15_009_849_344 / 2.68e12
    assert c.prefill_s(1024) == pytest.approx(fixed + max(compute, weights), rel=1e-12)  # this engine: no knee
    # A decode step of one token is a small GEMM (0.47 GFLOP a layer): ef 0.107, still well under the weights' read.
    one = 2 * 6_979_588_096 + 2 * T8B
    ef1 = 0.74 - 0.64 * 40 / (one / 32e9 + 40)
    assert ef1 == pytest.approx(0.1074, abs=1e-4)
    assert one / (989e12 * ef1) < weights / 3 and c.decode_s(1, 0) == pytest.approx(fixed + weights, rel=1e-12)
    # Larger steps only gain: the prefill's FLOP rate rises monotonically towards 0.74 of the peak.
    rates = [c.gpu.flops_efficiency_at(g) for g in (0, 1, 10, 100, 1000, 1e6)]
    assert rates == sorted(rates) and rates[0] == pytest.approx(0.1) and rates[-1] == pytest.approx(0.74, abs=1e-4)
    # fp8 weights on the fp8 cores: one efficiency (0.6 of 1979) at every size.
    fp8 = _clock("h100-sxm", weight_dtype="fp8", ramp=True)
    assert fp8.compute_s(1e12) == pytest.approx(fp8.compute_s(1e15) / 1000) == pytest.approx(1e12 / (1979e12 * 0.6))


def test_a_ramp_half_set_or_out_of_range_is_refused():
    spec = gpu_spec(load_group("gpu", "h100-sxm", GpuConfig))
    for bad in (dict(flops_ramp_gflop=None), dict(flops_efficiency_small=0.9), dict(flops_ramp_gflop=0),
                dict(fp8_flops_efficiency=1.5)):
        with pytest.raises(ConfigError, match=r"gpu\.(flops_efficiency_small|fp8_flops_efficiency)=.*gpu=h100-sxm"):
            dataclasses.replace(spec, **bad)


BASE = ["+impl=paged_torch", "scenario=capacity", "model=llama-3.1-8b", "gpu=h100-sxm"]


def test_weight_dtype_reaches_the_clock_and_its_own_dtype_is_auto(compose):
    cfg = resolve(compose([*BASE, "weight_dtype=fp8"]))
    assert cfg.weight_dtype == "fp8" and cost_model_for(cfg).model.weight_bytes == 8_030_261_248
    assert resolve(compose([*BASE, "weight_dtype=bfloat16"])).weight_dtype == "auto"  # = dtype: one job


@pytest.mark.parametrize("overrides,words", [
    ([*BASE, "weight_dtype=int3"], ["weight_dtype='int3'", "auto", "bfloat16", "fp8"]),
    ([*BASE[:-1], "weight_dtype=fp8"], ["weight_dtype=fp8", "gpu=NAME", "gpu=None"]),
    (["+impl=paged_torch", "scenario=decode", "device=cpu", "model=tiny-llama", "gpu=h100-sxm", "weight_dtype=fp8"],
     ["scenario=decode", "Leave it auto"]),
])
def test_a_bad_weight_dtype_names_the_key_and_what_is_allowed(compose, overrides, words):
    with pytest.raises(ConfigError) as err:
        resolve(compose(overrides))
    msg = str(err.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


def test_fp8_weights_leave_their_bytes_to_the_kv_budget(compose, tmp_path):
    """The budget counts the weights as stored: fp8 decoder layers free ~7 GB of an 8B model for KV."""
    from kvbench.harness.front.job import run_job
    from kvbench.harness.kv.sizes import stored_weight_bytes
    from tests.helpers.models import load_named

    rows = {}
    for w in ("auto", "fp8"):
        (row,), code = run_job(compose(["scenario=capacity", "model=llama-3.1-8b", "gpu=h100-sxm", "dtype=bfloat16",
                                        f"weight_dtype={w}", "+impl=paged", "workload.num_requests=20"]), tmp_path / w)
        assert code == 0, row.get("error")
        rows[w] = row
    saved = rows["auto"]["weight_bytes"] - rows["fp8"]["weight_bytes"]
    assert rows["fp8"]["weight_bytes"] == stored_weight_bytes(load_named("llama-3.1-8b"), "bfloat16", "fp8")
    assert saved > 6e9 and rows["fp8"]["budget_kv_bytes"] - rows["auto"]["budget_kv_bytes"] == saved
