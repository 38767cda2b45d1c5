"""harness/kv/factory.py's tensors for an MLA model: one kv head of kv_lora_rank + qk_rope_head_dim values, its V store
the K store, so the bytes a cache allocates per token are exactly cached_layers x (kv_lora_rank + qk_rope_head_dim) x
dtype bytes (plus a quantized store's per-token scale), what harness/kv/sizes.py's kv_bytes_per_token sizes the pool
with."""

from __future__ import annotations

import pytest
import torch

from kvbench.harness.kv.factory import cache_tensors
from kvbench.harness.kv.sizes import kv_bytes_per_token
from kvbench.harness.model.config import softmax_scale
from kvbench.impls.kinds import PoolSpec, cache_kind
from tests.helpers.models import load_named

TOKENS = 64


def allocated_bytes_per_token(cache, slots: int) -> float:
    """Every distinct tensor the cache holds per token and layer (an aliased V counted once)."""
    seen = {}
    for t in [*cache.k, *cache.v, *(s for sc in cache.scales or () for s in (sc.k, sc.v) if s.dim())]:
        seen[t.data_ptr()] = t.numel() * t.element_size()
    return sum(seen.values()) / slots


def test_the_tensors_are_one_latent_head_at_mla_s_scale():
    model = load_named("deepseek-v3")
    spec = cache_tensors(model, "bfloat16", "cpu")
    assert (spec.kv_heads, spec.head_dim, spec.latent, spec.num_heads) == (1, 576, True, 128)
    assert spec.scale == softmax_scale(model) == pytest.approx(192**-0.5 * (0.1 * torch.log(torch.tensor(40.0)).item()
                                                                            + 1) ** 2)
    plain = cache_tensors(load_named("tiny-llama"), "float32", "cpu")
    assert (plain.kv_heads, plain.head_dim, plain.latent) == (2, 64, False)


@pytest.mark.parametrize("name,layers", [("deepseek-v2-lite", 27), ("deepseek-v3", 61)])
@pytest.mark.parametrize("kind,block_size", [("paged", 16), ("contiguous", 0)])
@pytest.mark.parametrize("dtype,kv_dtype,kv_scale,value_bytes,scale_bytes", [
    ("bfloat16", "auto", "tensor", 2, 0), ("float32", "auto", "tensor", 4, 0),
    ("bfloat16", "fp8_e4m3", "tensor", 1, 0), ("bfloat16", "fp8_e4m3", "token_head", 1, 4)])
def test_a_latent_cache_allocates_the_latent_once(name, layers, kind, block_size, dtype, kv_dtype, kv_scale,
                                                  value_bytes, scale_bytes):
    model = load_named(name)
    per_token = kv_bytes_per_token(model, dtype, kv_dtype, kv_scale)
    assert per_token == layers * (576 * value_bytes + scale_bytes)
    spec = PoolSpec(kv_bytes=TOKENS * per_token, bytes_per_token=per_token, max_seq_len=TOKENS,
                    block_size=block_size or 16, max_num_seqs=1, min_tokens=1, watermark=0.0, prefix_caching=False)
    cache = cache_kind(kind).cache(spec, cache_tensors(model, dtype, "cpu", kv_dtype, kv_scale),
                                   "torch" if kind == "paged" else "sdpa")
    slots = cache.k[0].shape[0] * cache.k[0].shape[1]
    assert all(v is k for k, v in zip(cache.k, cache.v))
    assert allocated_bytes_per_token(cache, slots) == per_token
    assert cache.bytes_per_token == per_token


def test_an_ordinary_cache_allocates_k_and_v():
    """The comparison can fail: a model without a latent allocates a K and a V store per layer."""
    model = load_named("tiny-llama")
    per_token = kv_bytes_per_token(model, "float32")
    spec = PoolSpec(kv_bytes=TOKENS * per_token, bytes_per_token=per_token, max_seq_len=TOKENS, block_size=16,
                    max_num_seqs=1, min_tokens=1, watermark=0.0, prefix_caching=False)
    cache = cache_kind("paged").cache(spec, cache_tensors(model, "float32", "cpu"), "torch")
    assert allocated_bytes_per_token(cache, cache.k[0].shape[0] * 16) == per_token == 4 * 2 * 2 * 64 * 4
