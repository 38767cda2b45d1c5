"""SDPA with attention sinks (kernels/sdpa.py ``sink_sdpa``: a zero key column whose mask is the sink): the slab
decode against the reference, float and bfloat16, with and without a window, and the contiguous cache's
``decode_sdpa``."""

from __future__ import annotations

import pytest
import torch

from kvbench.kernels.reference import paged_decode_attention_ref
from kvbench.kernels.sdpa import additive_mask, decode_sdpa, slab_decode
from tests.helpers.kernel_cases import assert_close_for_dtype
from tests.helpers.sink_cases import SINK_LENS, SINK_WINDOWS, make_sinks


def _slab(lens, lanes, heads, length=100, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(lanes, length, 2, 32, generator=gen).to(dtype)
    v = torch.randn(lanes, length, 2, 32, generator=gen).to(dtype)
    q = torch.randn(len(lens), heads, 32, generator=gen).to(dtype)
    return q, k, v


@pytest.mark.parametrize("window", SINK_WINDOWS)
@pytest.mark.parametrize("gathered", [False, True])
@pytest.mark.parametrize("heads,dtype", [(8, torch.float32), (2, torch.float32), (4, torch.bfloat16)], ids=str)
def test_slab_decode_with_sinks_matches_reference(window, gathered, heads, dtype):
    lens = SINK_LENS
    q, k, v = _slab(lens, len(lens) + 2 if gathered else len(lens), heads, seed=window, dtype=dtype)
    lanes = torch.tensor([[len(lens) + 1 - i] for i in range(len(lens))], dtype=torch.int32) if gathered else None
    tables = lanes if gathered else torch.arange(len(lens), dtype=torch.int32)[:, None]
    context, sinks = torch.tensor(lens, dtype=torch.int32), make_sinks(heads, seed=window)
    got = slab_decode(q, k, v, lanes, context, 0.2, max_context=max(lens), window=window, sinks=sinks)
    # the reference reads the slab as a pool of one block per lane
    want = paged_decode_attention_ref(q.float(), k.float(), v.float(), tables, context, 0.2, window=window,
                                      sinks=sinks)
    assert_close_for_dtype(got, want, dtype)
    plain = paged_decode_attention_ref(q.float(), k.float(), v.float(), tables, context, 0.2, window=window)
    assert not torch.allclose(plain, want, atol=2e-2)


def test_a_full_slab_with_sinks():
    """No context_lens (no mask): every sequence holds max_context keys, and the sink still joins."""
    q, k, v = _slab([0, 0], 2, 4)
    sinks = make_sinks(4)
    got = slab_decode(q, k, v, None, None, 0.2, max_context=64, sinks=sinks)
    tables = torch.arange(2, dtype=torch.int32)[:, None]
    want = paged_decode_attention_ref(q, k, v, tables, torch.full((2,), 64, dtype=torch.int32), 0.2, sinks=sinks)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("boolean", [True, False])
def test_decode_sdpa_takes_a_boolean_or_an_additive_mask(boolean):
    lens = SINK_LENS
    q, k, v = _slab(lens, len(lens), 4, length=max(lens))
    context, sinks = torch.tensor(lens, dtype=torch.int32), make_sinks(4)
    mask = (torch.arange(max(lens))[None, :] < context[:, None])[:, None, None, :]
    got = decode_sdpa(q, k, v, 0.2, mask if boolean else additive_mask(mask, q.dtype), sinks)
    tables = torch.arange(len(lens), dtype=torch.int32)[:, None]
    want = paged_decode_attention_ref(q, k, v, tables, context, 0.2, sinks=sinks)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kv_dtype,kv_scale", [("fp8_e4m3", "tensor"), ("int8", "token_head")])
def test_slab_decode_with_sinks_on_a_quantized_slab(kv_dtype, kv_scale):
    from tests.helpers.kv_quant_cases import quantized_copy

    lens = SINK_LENS
    q, k, v = _slab(lens, len(lens), 4, seed=3)
    kq, vq, scales = quantized_copy(k, v, kv_dtype, kv_scale)
    context, sinks = torch.tensor(lens, dtype=torch.int32), make_sinks(4)
    got = slab_decode(q, kq, vq, None, context, 0.2, max_context=max(lens), scales=scales, sinks=sinks)
    tables = torch.arange(len(lens), dtype=torch.int32)[:, None]
    want = paged_decode_attention_ref(q, kq, vq, tables, context, 0.2, scales=scales, sinks=sinks)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("way", ["sink_column_sdpa", "sink_rescaled_cpu"])
@pytest.mark.parametrize("tq,heads,masked", [(1, 8, True), (1, 2, False), (7, 4, True), (7, 4, False)])
def test_both_ways_of_adding_the_sink_follow_the_rule(way, tq, heads, masked):
    """The zero key column (any device; on CPU only through this test) and the CPU flash kernel's log-sum-exp
    rescale, against the rule by loops: decode-shaped and prefill-shaped queries, grouped or not."""
    from kvbench.kernels import sdpa
    from tests.helpers.sink_cases import naive_sink_attention

    gen = torch.Generator().manual_seed(tq * heads)
    length = 19
    q = torch.randn(1, heads, tq, 32, generator=gen)
    k, v = torch.randn(1, 2, length, 32, generator=gen), torch.randn(1, 2, length, 32, generator=gen)
    sinks = make_sinks(heads, seed=tq)
    pos_q = torch.arange(length - tq, length)[:, None]
    mask = (torch.arange(length)[None, :] <= pos_q)[None, None] if masked else None
    got = getattr(sdpa, way)(q, k, v, 0.2, mask, sinks)
    kk, vv = k[0].transpose(0, 1), v[0].transpose(0, 1)  # [L, KVH, D]
    if masked:  # causal: query t at position length - tq + t
        want = naive_sink_attention(q[0].transpose(0, 1), kk, vv, 0.2, 0, sinks)
    else:  # every key visible to every query: each query as the last of its own
        want = torch.stack([naive_sink_attention(q[0, :, t][None], kk, vv, 0.2, 0, sinks)[0] for t in range(tq)])
    torch.testing.assert_close(got[0].transpose(0, 1), want, atol=1e-5, rtol=1e-5)
