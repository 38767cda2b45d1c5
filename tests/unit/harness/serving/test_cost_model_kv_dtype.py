"""The simulated clock reads a quantized cache's bytes: fewer per token at fp8, scales included,
through the one kv_bytes_per_token (harness/kv/sizes.py)."""

from __future__ import annotations

import pytest

from kvbench.harness.front.groups import load_group
from kvbench.harness.front.resolve import resolve
from kvbench.harness.kv.sizes import kv_bytes_per_token
from kvbench.harness.model.config import ModelConfig
from kvbench.harness.serving.cost_model import cost_model_for, model_cost


def test_model_cost_reads_the_kv_dtype():
    m = load_group("model", "llama-3.1-8b", ModelConfig)
    bf16, fp8 = model_cost(m, "bfloat16"), model_cost(m, "bfloat16", "fp8_e4m3", "token_head")
    assert fp8.kv_bytes_per_token == kv_bytes_per_token(m, "bfloat16", "fp8_e4m3", "token_head") == 2 * 32 * 8 * 132
    assert bf16.kv_bytes_per_token == 2 * 32 * 8 * 256 and fp8.weight_bytes == bf16.weight_bytes


def test_decode_step_at_fp8_reads_fewer_bytes(compose):
    base = ["scenario=capacity", "model=llama-3.1-8b", "gpu=h200", "+impl=paged_torch"]
    bf16 = cost_model_for(resolve(compose(base)))
    fp8 = cost_model_for(resolve(compose([*base, "kv_dtype=fp8_e4m3"])))
    batch, kv_tokens = 64, 64 * 4096
    # The memory term: weights plus the KV read; at fp8 the KV half costs half.
    kv_time = lambda c: c.decode_s(batch, kv_tokens) - c.decode_s(batch, 0)  # noqa: E731
    assert kv_time(fp8) == pytest.approx(kv_time(bf16) / 2, rel=1e-9)
    assert fp8.decode_s(batch, kv_tokens) < bf16.decode_s(batch, kv_tokens)
