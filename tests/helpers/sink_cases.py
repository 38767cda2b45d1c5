"""Attention-sink cases shared by every kernel's and cache's sink tests.

A sink (kernels/sinks.py) is one logit per query head in every softmax's denominator, with no value.
``naive_sink_decode`` and ``naive_sink_attention`` state that rule directly (a softmax over
``[scores, sink]`` by loops), so the reference is checked against them, every kernel against the
reference on fresh random inputs (tests/helpers/kernel_cases.py), and every cache against them.
"""

from __future__ import annotations

import torch

from kvbench.impls.base import KVCache
from kvbench.kernels.reference import gather_kv, paged_decode_attention_ref
from tests.helpers.kernel_cases import TOLERANCE, DecodeKernel, assert_close_for_dtype, make_decode_inputs
from tests.helpers.kv_quant_cases import quantized_copy
from tests.helpers.window_cases import check_cache_windows

# Contexts: one token, a ragged block, several blocks; windows none, shorter than some contexts, longer than all.
SINK_LENS = [1, 5, 17, 97]
SINK_WINDOWS = [0, 5, 16, 200]


def make_sinks(num_heads: int, seed: int = 0) -> torch.Tensor:
    """Sinks spread over [-1, 6): small ones change little, large ones take most of a short context's weight
    (a randn q . k score scaled by head_dim**-0.5 is about N(0, 1)), so a kernel ignoring them fails."""
    gen = torch.Generator().manual_seed(1000 + seed)
    return torch.rand(num_heads, generator=gen) * 7 - 1


def _softmax_with_sink(scores: torch.Tensor, sink: torch.Tensor | None) -> torch.Tensor:
    """The softmax over ``[scores, sink]`` with the sink's column dropped (no sink: plain softmax)."""
    if sink is None:
        return torch.softmax(scores, dim=0)
    return torch.softmax(torch.cat([scores, sink.reshape(1)]), dim=0)[:-1]


def naive_sink_decode(q, k_cache, v_cache, block_tables, context_lens, scale, sinks, window=0) -> torch.Tensor:
    """Each sequence's query over its (last ``window``) keys and its head's sink, in fp32, by loops."""
    out = torch.empty(q.shape, dtype=torch.float32)
    group = q.shape[1] // k_cache.shape[2]
    for b, n in enumerate(context_lens.tolist()):
        first = max(0, n - window) if window > 0 else 0
        k = gather_kv(k_cache, block_tables[b], n)[first:].float()
        v = gather_kv(v_cache, block_tables[b], n)[first:].float()
        for h in range(q.shape[1]):
            probs = _softmax_with_sink((k[:, h // group] @ q[b, h].float()) * scale, sinks[h])
            out[b, h] = probs @ v[:, h // group]
    return out


def naive_sink_attention(q, k, v, scale, window, sinks) -> torch.Tensor:
    """q ``[T, H, D]``: the last ``T`` positions of keys ``k``/``v`` ``[L, KVH, D]``; query ``i`` at position
    ``p = L - T + i`` over keys ``p - window < j <= p`` (every ``j <= p`` when ``window`` <= 0) and its head's
    sink (``sinks`` None: none), by loops in fp32."""
    t, length = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    out = torch.empty(q.shape, dtype=torch.float32)
    for i in range(t):
        p = length - t + i
        first = max(0, p - window + 1) if window > 0 else 0
        for h in range(q.shape[1]):
            kh, vh = k[first:p + 1, h // group].float(), v[first:p + 1, h // group].float()
            sink = None if sinks is None else sinks[h]
            out[i, h] = _softmax_with_sink((kh @ q[i, h].float()) * scale, sink) @ vh
    return out


def check_sink_decode(kernel: DecodeKernel, lens, window, kv_heads, group, head_dim, block_size, dtype,
                      seed=0, kv_dtype: str | None = None, kv_scale: str = "tensor", **kernel_options) -> None:
    """``kernel(..., sinks=, window=)`` fills a NaN-filled ``out`` with the fp32 reference's result within the
    dtype's tolerance, where the reference without sinks lies outside it. ``kv_dtype`` (fp8_e4m3, fp8_e5m2,
    int8): over a cache quantized by the reference writer, with its ``scales``."""
    q, k_cache, v_cache, tables, lens_t = make_decode_inputs(
        lens, kv_heads, group, head_dim, block_size, torch.float32 if kv_dtype else dtype, seed=seed)
    extra = {}
    if kv_dtype is not None:
        k_cache, v_cache, extra["scales"] = quantized_copy(k_cache, v_cache, kv_dtype, kv_scale)
        q = q.to(dtype)
    sinks = make_sinks(q.shape[1], seed)
    if window:
        extra["window"] = window
    scale = head_dim**-0.5
    out = torch.full_like(q, float("nan"))
    got = kernel(q, k_cache, v_cache, tables, lens_t, scale, out=out, sinks=sinks, **extra, **kernel_options)
    assert got is out
    assert not torch.isnan(out).any(), "output rows left unwritten"
    kf, vf = (k_cache, v_cache) if kv_dtype else (k_cache.float(), v_cache.float())
    want = paged_decode_attention_ref(q.float(), kf, vf, tables, lens_t, scale, sinks=sinks, **extra)
    assert_close_for_dtype(out, want, dtype)
    # The sinks changed the result beyond the tolerance: a kernel that ignores them cannot pass.
    plain = paged_decode_attention_ref(q.float(), kf, vf, tables, lens_t, scale, **extra)
    atol, rtol = TOLERANCE[dtype]
    assert not torch.allclose(plain, want, atol=atol, rtol=rtol)


def layer_sinks(layers_with_sinks: list[bool], num_heads: int) -> list[torch.Tensor | None]:
    """``KVCache.set_layer_sinks``'s argument: fresh sinks for the layers marked True, None for the rest."""
    return [make_sinks(num_heads, seed=i) if has else None for i, has in enumerate(layers_with_sinks)]


def check_cache_sinks(cache: KVCache, windows: list[int], sinks: list[torch.Tensor | None], prompts: list[int],
                      steps: int, chunk: int, seed: int = 0) -> None:
    """``check_cache_windows`` with ``sinks`` set on the cache: prefill chunks and decode steps through every
    layer, each output equal to ``naive_sink_attention`` with its layer's window and sinks."""
    check_cache_windows(cache, windows, prompts, steps, chunk, seed=seed, sinks=sinks)
