"""The roofline (harness/serving/cost_model.py) against published step times it was not fitted to alone.

Reference: gpt-fast's README (github.com/pytorch-labs/gpt-fast, "Benchmarks" and "Tensor Parallelism"):
8xA100-80GB power-limited to 330 W, batch size 1, a 5-token prompt, bf16, torch.compile with CUDA graphs.
Llama-2-7B on 1 GPU: 104.9 tokens/s; Llama-2-70B on 2, 4 and 8 GPUs: 21.32, 38.01 and 62.50 tokens/s.
At batch 1 one token is one decode step, so a step is 1 / (tokens/s).

The version-2 roofline with conf/gpu/a100-80gb.yaml must put each within 10%. Version 1 (no per-layer
cost, the datasheet bandwidth x 0.8) priced the 4- and 8-GPU steps 12% and 21% too fast, so it fails
here: ``test_version_1_would_fail_these_ranges`` keeps that true. What these points cannot check:
batch > 1 (the attention term and its efficiency), and prefill (gpt-fast's prompt is 5 tokens).
"""

from __future__ import annotations

import dataclasses

import pytest

from kvbench.harness.config import GpuConfig
from kvbench.harness.front.groups import load_group
from kvbench.harness.model.config import ModelConfig
from kvbench.harness.serving.cost_model import CostModel, gpu_spec, model_cost
from kvbench.harness.serving.engine_profile import EngineSpec

# (model, tensor-parallel GPUs, published tokens/s at batch 1)
GPT_FAST_A100 = [("llama-2-7b", 1, 104.9), ("llama-2-70b", 2, 21.32), ("llama-2-70b", 4, 38.01),
                 ("llama-2-70b", 8, 62.50)]
CONTEXT = 100  # KV tokens read per step: gpt-fast generates 200 tokens after 5; the middle of the run


def _model(name: str) -> ModelConfig:
    if name == "llama-2-70b":  # Llama-3.1-70B's shape with Llama 2's 32,000-token vocabulary (68.98B parameters)
        return dataclasses.replace(load_group("model", "llama-3.1-70b", ModelConfig), name=name, vocab_size=32000)
    return load_group("model", name, ModelConfig)


# gpt-fast's host costs, fitted here (roofline version 5 put them in every GPU file; version 6 in conf/engine/, whose
# layer_overhead_us is this fit's): 500 us a step, 30 us a layer, in series, no per-sequence cost at batch 1.
GPT_FAST = EngineSpec("gpt-fast", step_overhead_us=500, layer_overhead_us=30)


def _clock(name: str, count: int, layer_overhead_us: float = 30, **changes) -> CostModel:
    spec = dataclasses.replace(gpu_spec(load_group("gpu", "a100-80gb", GpuConfig)), count=count, **changes)
    engine = dataclasses.replace(GPT_FAST, layer_overhead_us=layer_overhead_us)
    return CostModel(spec, model_cost(_model(name), "bfloat16"), engine=engine)


def test_llama_2_70b_has_the_published_parameter_count():
    assert model_cost(_model("llama-2-70b"), "bfloat16").params == pytest.approx(68.98e9, rel=2e-3)


@pytest.mark.parametrize("name,count,tokens_per_s", GPT_FAST_A100)
def test_batch_1_decode_steps_within_10_percent_of_gpt_fast(name, count, tokens_per_s):
    measured = 1 / tokens_per_s
    assert _clock(name, count).decode_s(1, CONTEXT) == pytest.approx(measured, rel=0.10)


def test_version_1_would_fail_these_ranges():
    """Version 1's figures on this formula: no per-layer cost, the datasheet bandwidth x bw_efficiency
    (no copy measurement), attention at the weights' rate (at batch 1 it then equals version 1's sum)."""
    misses = [name for name, count, tps in GPT_FAST_A100
              if _clock(name, count, layer_overhead_us=0, copy_bandwidth_gbps=None, attn_bw_efficiency=1.0
                        ).decode_s(1, CONTEXT) < 0.9 / tps]
    assert len(misses) >= 2  # the 4- and 8-GPU steps


def test_the_70b_steps_differ_by_the_weights_read_at_the_copy_rate():
    """Why copy_bandwidth_gbps: gpt-fast's 2-, 4- and 8-GPU steps differ by what W/(n*A) predicts with
    A = 1700 GB/s (its README's "peak bandwidth is about 1700 GB/s") to within 5%."""
    step = {count: 1 / tps for name, count, tps in GPT_FAST_A100 if name == "llama-2-70b"}
    w = model_cost(_model("llama-2-70b"), "bfloat16").weight_bytes
    for a, b in [(2, 4), (4, 8), (2, 8)]:
        predicted = w / 1700e9 * (1 / a - 1 / b)
        assert step[a] - step[b] == pytest.approx(predicted, rel=0.05)
