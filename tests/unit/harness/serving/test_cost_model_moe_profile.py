"""The routed experts' price against published fused_moe kernel times (roofline version 10).

docs/validation/fused_moe_kernels.csv: 24 rows of vLLM's benchmarks/kernels/benchmark_moe.py as three pull requests
published them (each row's source_url): one MoE layer's time (routing, both grouped GEMMs, activation, sum) at
256-4096 tokens, bf16, on an H200 (E=128, N=704, top-8), an H100 (Mixtral's TP2 shard, E=8, N=7168, top-2) and an
A100-SXM4-80GB (E=64, N=1408, top-6). Each is priced as the clock prices a step's matmuls (harness/serving/
cost_model.py): a one-layer model of those experts, the GPU file's figures, vllm_v1's knee and ``moe_gemm_half_n``.
"""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from kvbench.harness.config import EngineConfig, GpuConfig
from kvbench.harness.front.groups import load_group
from kvbench.harness.serving.cost_model import CostModel, ModelCost, gpu_spec
from kvbench.harness.serving.engine_profile import engine_spec
from kvbench.harness.serving.layer_terms import Experts
from tests.conftest import REPO_ROOT

KERNELS = REPO_ROOT / "docs" / "validation" / "fused_moe_kernels.csv"


def _one_layer(row) -> ModelCost:
    """The row's MoE layer as a one-layer model: every parameter an expert's (gate, up and down: 3 x N x K)."""
    per_expert = 3 * row.width * row.hidden
    return ModelCost(params=row.experts * per_expert, weight_bytes=row.experts * per_expert * 2, kv_bytes_per_token=0,
                     num_layers=1, hidden_size=row.hidden, elem_bytes=2,
                     experts=Experts(layers=1, count=row.experts, per_token=row.top_k, expert_bytes=per_expert * 2,
                                     expert_params=per_expert, width=row.width))


def _errors(rows: pd.DataFrame, **engine_overrides) -> pd.Series:
    engine = dataclasses.replace(engine_spec(load_group("engine", "vllm_v1", EngineConfig), offline=True),
                                 **engine_overrides)
    errors = []
    for row in rows.itertuples():
        clock = CostModel(gpu_spec(load_group("gpu", row.gpu, GpuConfig)), _one_layer(row), engine=engine)
        price = engine.matmul_s(clock.weights_s(row.tokens), clock.matmul_compute_s(row.tokens, 0))
        errors.append(price / (row.kernel_us * 1e-6) - 1)
    return pd.Series(errors, index=rows.index)


@pytest.fixture(scope="module")
def kernels() -> pd.DataFrame:
    return pd.read_csv(KERNELS)


def test_the_published_kernel_times_are_priced_within_a_few_percent(kernels):
    assert len(kernels) == 24 and kernels.gpu.nunique() == 3 and kernels.width.nunique() == 3
    err = _errors(kernels)
    assert err.abs().median() < 0.06  # measured: 4.3%
    assert err.abs().quantile(0.9) < 0.12  # measured: 10%
    by_shape = err.groupby(kernels.width).median()  # no shape off as a whole, narrow experts or wide
    assert by_shape.abs().max() < 0.10, by_shape.to_dict()


def test_experts_at_the_dense_rate_or_one_share_miss_them(kernels):
    """The experts as dense GEMMs price the narrow ones 25-45% fast; one share (0.5) for every width prices
    Mixtral's wide ones up to 48% slow: the width is what sets the rate."""
    fit = _errors(kernels).abs().median()
    assert _errors(kernels, moe_gemm_half_n=None).abs().median() > 3 * fit
    wide = kernels.width == kernels.width.max()
    one_share = _errors(kernels[wide], moe_gemm_half_n=float(kernels.width.max()))  # em = 0.5 at that width
    assert one_share.max() > 0.3


def test_the_experts_rate_by_width_and_tensor_parallel(compose):
    """em = N / (N + n0), N an expert's width on one GPU: tensor parallelism splits it, and narrows the rate."""
    from kvbench.harness.front.resolve import resolve
    from kvbench.harness.serving.cost_model import cost_model_for

    base = ["scenario=capacity", "model=qwen3-30b-a3b", "gpu=h100-sxm", "+impl=paged"]
    one, two = (cost_model_for(resolve(compose([*base, f"gpu.count={n}"]))) for n in (1, 2))
    assert one._expert_rate == pytest.approx(768 / (768 + 700))
    assert two._expert_rate == pytest.approx(384 / (384 + 700))
    dense = cost_model_for(resolve(compose([*base, "engine=trtllm"])))  # null: the dense rate
    assert dense._expert_rate == 1.0
    # The experts' FLOPs, and only theirs, slow down: 8,192 tokens' matmuls, exactly.
    m = one.model
    flops, expert = m.flops(8192, 1), m.experts.flops(8192)
    rate = one._peak_flops_per_s * one.gpu.flops_efficiency_at(flops / (m.num_layers * 1e9))
    assert one.matmul_compute_s(8192, 1) == pytest.approx((flops - expert) / rate + expert / (rate * one._expert_rate))
    assert 0 < expert < flops
