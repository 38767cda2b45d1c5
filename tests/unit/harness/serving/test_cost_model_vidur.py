"""The roofline against a profiled simulator's operator times: Vidur's Llama-3-70B on 2 x A100-80GB (TP2).

Vidur (github.com/microsoft/vidur @ 7d475133) prices a decode step as the sum of its profiled kernels, 80 layers of:
the four linear layers, attention decode (x 1.1 for GQA at batch > 1), two all-reduces (each + 0.02 ms of NCCL
launch), two norms, RoPE and an add; no LM head, no host. Its profiles: data/profiling/compute/a100/meta-llama/
Meta-Llama-3-70B/mlp.csv (PyTorch eager, fp16), attention from data/profiling/a100/attention.csv @ e2d00e9a (the same
attention shape at TP2: 32 query heads, 4 KV heads of 128 a GPU; the Llama-3-70B file at HEAD is over the fetch
size), all-reduce data/profiling/network/a100_pairwise_nvlink/all_reduce.csv: Azure's NC96ads A100 v4, "4 80GB A100
PCIe GPUs with pair-wise NVLINK" (Vidur's docs/profiling.md), hence gpu=a100-80gb-pcie here. Summed from the rows
(nearest profiled all-reduce size), in ms:

    batch 16:  54.9 (context 512), 56.8 (1024), 58.1 (2048)      batch 128: 85.7 (512), 92.6 (1024), 106.4 (2048)

Issue 46 quotes "about 57.5 and 83" for the same profile. The clock (version 9: vllm_v1's knee, attention at 0.9 of
the copy rate, the A100's FLOP efficiency by a step's work) prices the device's step (no host cost: an engine of its
layer cost and knee only) within 15% of each: 50.6, 51.6, 53.5 and 74.3, 82.1, 97.5 ms (version 8, one efficiency of
0.6: 50.4, 51.4, 53.3 and 78.2, 85.9, 101.3). What it leaves out that Vidur has: eager NCCL's 40-65 us all-reduces
(vLLM runs its own under CUDA graphs; the GPU file's 10 us).
"""

from __future__ import annotations

import dataclasses

import pytest

from kvbench.harness.front.resolve import resolve
from kvbench.harness.serving.cost_model import CostModel, cost_model_for
from kvbench.harness.serving.engine_profile import EngineSpec

VIDUR_MS = {(16, 512): 54.9, (16, 1024): 56.8, (16, 2048): 58.1, (128, 512): 85.7, (128, 1024): 92.6,
            (128, 2048): 106.4}


def _device_clock(compose, knee: str | None = None) -> CostModel:
    args = ["scenario=capacity", "model=llama-3.1-70b", "dtype=float16", "gpu=a100-80gb-pcie", "gpu.count=2",
            "+impl=paged", "engine=vllm_v1"]
    c = cost_model_for(resolve(compose(args)))
    eng = c.engine
    return CostModel(c.gpu, c.model, engine=EngineSpec("device", layer_overhead_us=eng.layer_overhead_us,
                                                        gemm_knee=eng.gemm_knee if knee is None else None))


@pytest.mark.parametrize("batch,context", sorted(VIDUR_MS))
def test_a_decode_step_is_within_15_percent_of_vidurs_profiled_kernels(compose, batch, context):
    price_ms = _device_clock(compose).decode_s(batch, batch * context) * 1e3
    assert price_ms == pytest.approx(VIDUR_MS[batch, context], rel=0.15)


def test_a_sharp_roofline_prices_batch_128_outside_the_band(compose):
    """Version 7's max(read, FLOPs): at batch 128 the matmuls sit on A100's ridge, where the profile's take 1.35x
    their 16-token time and the max says 1.06x: 18-25% fast."""  # (0.743 against 0.548 ms a layer, Llama-3-70B)
    sharp = _device_clock(compose, knee="sharp")
    assert sharp.engine.gemm_knee is None
    for context in (512, 1024):
        assert sharp.decode_s(128, 128 * context) * 1e3 < 0.85 * VIDUR_MS[128, context]
    assert dataclasses.replace(sharp.engine, gemm_knee=1.5).matmul_s(1.0, 1.0) == pytest.approx(2 ** (2 / 3))
