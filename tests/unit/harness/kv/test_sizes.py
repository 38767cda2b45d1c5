"""harness/kv/sizes.py: one KV bytes-per-token formula, quantized stores and their scales included,
and what it gives at full scale: paged at fp8 holds twice the tokens of bf16, less the scales."""

from __future__ import annotations

import pytest

from kvbench.harness.kv.sizes import kv_bytes_per_token
from kvbench.harness.front.groups import load_group
from kvbench.harness.model.config import ModelConfig
from kvbench.impls.kinds import PoolSpec, cache_kind

GB = 10**9


def _model(name: str) -> ModelConfig:
    return load_group("model", name, ModelConfig)


def _spec(bytes_per_token: int, kv_bytes: int = 60 * GB) -> PoolSpec:
    return PoolSpec(kv_bytes=kv_bytes, bytes_per_token=bytes_per_token, max_seq_len=8192, block_size=16,
                    max_num_seqs=10**6, min_tokens=1, watermark=0.0, prefix_caching=False)


def test_formula_counts_values_and_per_token_scales():
    m = _model("llama-3.1-8b")  # 32 layers, 8 kv heads x 128
    assert kv_bytes_per_token(m, "bfloat16") == 2 * 32 * 8 * 128 * 2 == 131072
    assert kv_bytes_per_token(m, "bfloat16", "auto", "token_head") == 131072  # a float store has no scales
    for fmt in ("fp8_e4m3", "fp8_e5m2", "int8"):
        assert kv_bytes_per_token(m, "bfloat16", fmt, "tensor") == 2 * 32 * 8 * 128  # per-layer scales: not per token
        assert kv_bytes_per_token(m, "bfloat16", fmt, "token_head") == 2 * 32 * 8 * (128 + 4)
        assert kv_bytes_per_token(m, "float32", fmt) == kv_bytes_per_token(m, "bfloat16", fmt)


@pytest.mark.parametrize("name", ["llama-3.1-8b", "llama-3.1-70b"])
def test_paged_fp8_holds_twice_the_tokens_of_bf16_less_the_scales(name):
    m = _model(name)
    kind = cache_kind("paged")
    tokens = {}
    for kv_dtype, kv_scale in (("auto", "tensor"), ("fp8_e4m3", "tensor"), ("fp8_e4m3", "token_head")):
        spec = _spec(kv_bytes_per_token(m, "bfloat16", kv_dtype, kv_scale))
        tokens[kv_dtype, kv_scale] = kind.num_blocks(spec) * spec.block_size
    bf16, fp8, fp8_heads = tokens["auto", "tensor"], tokens["fp8_e4m3", "tensor"], tokens["fp8_e4m3", "token_head"]
    assert fp8 / bf16 == pytest.approx(2.0, rel=1e-4)
    # 4 bytes of scale per 128 bytes of values: 256 / 132 of bf16's tokens
    assert fp8_heads / bf16 == pytest.approx(256 / 132, rel=1e-4)
    # and max concurrency follows: requests of 2048 tokens
    conc = {k: kind.max_concurrency(_spec(kv_bytes_per_token(m, "bfloat16", *k)), 2048) for k in tokens}
    assert conc["fp8_e4m3", "tensor"] == pytest.approx(2 * conc["auto", "tensor"], abs=1)
