"""Grouped-query attention through torch SDPA without SDPA's GQA flag.

On CUDA, ``scaled_dot_product_attention`` with an ``attn_mask`` and ``enable_gqa=True``
has no flash or memory-efficient kernel and falls back to the math path (K/V repeated
per query head, fp32 intermediates: several times the memory traffic). Every query head
of a group reads the same K/V head, so the group is folded into the query length
instead: queries ``[B, kv_heads, group * Tq, D]`` over keys ``[B, kv_heads, L, D]``.
That is plain multi-head attention with as many heads as the cache has, which the
flash, memory-efficient and cuDNN backends all take, with or without a mask.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# Decode attends over a key length that grows by one every step, and prefill over
# prompts of every length. cuDNN's SDPA builds an execution plan per new shape: on an
# H200 (torch 2.11) a bf16 decode call then took 40 ms where the memory-efficient kernel
# took 0.1 ms. Calls whose shapes vary keep every other backend SDPA may use.
_ENABLED = (
    (SDPBackend.FLASH_ATTENTION, torch.backends.cuda.flash_sdp_enabled),
    (SDPBackend.EFFICIENT_ATTENTION, torch.backends.cuda.mem_efficient_sdp_enabled),
    (SDPBackend.MATH, torch.backends.cuda.math_sdp_enabled),
)


def shape_stable_backends() -> list[SDPBackend]:
    """The SDPA backends enabled now (an outer ``sdpa_kernel`` is respected), without cuDNN."""
    return [backend for backend, enabled in _ENABLED if enabled()]


def grouped_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
    varying_shapes: bool = False,
) -> torch.Tensor:
    """q ``[B, H, Tq, D]``, k/v ``[B, KVH, L, D]`` with ``H % KVH == 0`` -> ``[B, H, Tq, D]``.

    ``mask`` is boolean ``[B or 1, 1, Tq, L]`` (True = visible), or additive_mask's float version of
    one, shared by every head.
    ``is_causal`` (no mask, ``Tq == L``) keeps SDPA's own GQA flag: the flash backend
    takes causal grouped-query attention as it is, and folding would need a mask.
    ``varying_shapes`` (decode) keeps CUDA calls off backends that re-plan per shape.
    """
    backends = sdpa_kernel(shape_stable_backends()) if varying_shapes and q.is_cuda else contextlib.nullcontext()
    with backends:
        return _grouped_sdpa(q, k, v, scale, mask, is_causal)


def _grouped_sdpa(q, k, v, scale, mask, is_causal) -> torch.Tensor:
    batch, heads, tq, dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    if group == 1 or (is_causal and mask is None):
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=group > 1
        )
    qf = q.reshape(batch, kv_heads, group * tq, dim)  # head h = kvh * group + g, as GQA groups them
    if mask is not None and tq > 1:
        mask = mask.repeat(1, 1, group, 1)  # folded row g * Tq + t has query t's mask
    out = F.scaled_dot_product_attention(qf, k, v, attn_mask=mask, scale=scale)
    return out.reshape(batch, heads, tq, dim)


def sink_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, mask: torch.Tensor | None,
              sinks: torch.Tensor, varying_shapes: bool = False) -> torch.Tensor:
    """``grouped_sdpa`` with attention sinks (kernels/sinks.py): q ``[B, H, Tq, D]``, k/v ``[B, KVH, L, D]``,
    ``mask`` boolean or additive ``[B or 1, 1, Tq, L]`` (None: every key visible), ``sinks`` ``[H]``.

    On CPU, torch's flash kernel returns each row's log-sum-exp with the output: the sink only adds
    ``exp(sink)`` to the denominator, so the output is rescaled by ``sigmoid(lse - sink)`` (no copy).
    Elsewhere the sink is one more key, of value 0, whose score is the sink itself: a zero key column scores 0,
    and the additive mask adds the sink there (per head, so the mask is ``[.., H, Tq, L + 1]``, folded like q);
    K and V are copied once to hold the column. A layer without sinks never comes here.
    """
    if q.device.type == "cpu":
        return sink_rescaled_cpu(q, k, v, scale, mask, sinks)
    backends = sdpa_kernel(shape_stable_backends()) if varying_shapes and q.is_cuda else contextlib.nullcontext()
    with backends:
        return sink_column_sdpa(q, k, v, scale, mask, sinks)


def sink_column_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, mask: torch.Tensor | None,
                     sinks: torch.Tensor) -> torch.Tensor:
    """``sink_sdpa`` on any device: the sink as a zero key and value column, its score added by the mask."""
    batch, heads, tq, dim = q.shape
    kv_heads, length = k.shape[1], k.shape[2]
    zero = k.new_zeros(batch, kv_heads, 1, dim)
    k, v = torch.cat([k, zero], dim=2), torch.cat([v, zero.to(v.dtype)], dim=2)
    if mask is None:
        bias = torch.zeros(1, 1, tq, length, dtype=q.dtype, device=q.device)
    else:
        bias = additive_mask(mask, q.dtype) if mask.dtype == torch.bool else mask
    rows = bias.shape[0]
    sink = sinks.to(q.dtype).view(1, heads, 1, 1).expand(rows, heads, tq, 1)
    bias = torch.cat([bias.expand(rows, heads, tq, length), sink], dim=-1)
    # Query head h = kvh * group + g reads kv head kvh: fold the group into the query rows, and the mask alike.
    qf = q.reshape(batch, kv_heads, heads // kv_heads * tq, dim)
    bias = bias.reshape(rows, kv_heads, heads // kv_heads * tq, length + 1)
    out = F.scaled_dot_product_attention(qf, k, v, attn_mask=bias, scale=scale)
    return out.reshape(batch, heads, tq, dim)


def sink_rescaled_cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, mask: torch.Tensor | None,
                       sinks: torch.Tensor) -> torch.Tensor:
    """``sink_sdpa`` on CPU: the flash kernel's output and log-sum-exp over the keys, with the group folded
    into the query rows (as ``_grouped_sdpa``), the output then scaled by ``sigmoid(lse - sink)``; measured
    (bf16, 8 x 2048 keys, 32 heads over 8) at plain SDPA's time, where the zero key column's copies took 3x."""
    batch, heads, tq, dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    if mask is not None:
        mask = additive_mask(mask, q.dtype) if mask.dtype == torch.bool else mask
        if group > 1 and tq > 1:
            mask = mask.repeat(1, 1, group, 1)  # folded row g * Tq + t has query t's mask
    qf = q.reshape(batch, kv_heads, group * tq, dim)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qf, k, v, attn_mask=mask, scale=scale)
    keep = torch.sigmoid(lse.reshape(batch, heads, tq) - sinks.view(1, heads, 1))  # S / (S + exp(sink))
    return (out.reshape(batch, heads, tq, dim).float() * keep[..., None]).to(q.dtype)


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean SDPA mask (True = visible) as the float mask SDPA itself converts it to (0 where
    visible, -inf elsewhere, in ``dtype``), so one conversion can serve every layer of a step."""
    return torch.where(mask.logical_not(), float("-inf"), torch.zeros((), dtype=dtype, device=mask.device))


def step_bias(meta, dtype: torch.dtype) -> torch.Tensor:
    """A decode step's ``meta.mask`` as ``additive_mask``'s float mask: made at the step's first layer and
    kept in ``meta.bias`` for every other (again only where the queries' dtype changes). Given the boolean
    mask, SDPA would convert it at every layer."""
    if meta.bias is None or meta.bias.dtype != dtype:
        meta.bias = additive_mask(meta.mask, dtype)
    return meta.bias


def decode_sdpa(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float,
                mask: torch.Tensor | None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """One decode token per sequence over its keys: q ``[B, H, D]``, keys/values ``[B, L, KVH, D]``
    (the layout a slab or a gather gives), ``mask`` ``[B, 1, 1, L]`` (boolean, or additive_mask's) -> ``[B, H, D]``.
    ``sinks`` ``[H]``: a layer's attention sinks (``sink_sdpa``); None: none."""
    if sinks is not None:
        return sink_sdpa(q.unsqueeze(2), keys.transpose(1, 2), values.transpose(1, 2), scale, mask, sinks,
                         varying_shapes=True).squeeze(2)
    return grouped_sdpa(q.unsqueeze(2), keys.transpose(1, 2), values.transpose(1, 2), scale,
                        mask=mask, varying_shapes=True).squeeze(2)


def slab_decode(q: torch.Tensor, k_slab: torch.Tensor, v_slab: torch.Tensor, block_tables: torch.Tensor | None,
                context_lens: torch.Tensor | None, scale: float, out: torch.Tensor | None = None, *,
                max_context: int | None = None, validate: bool = True, scales=None, window: int = 0,
                sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Decode attention over a contiguous slab with the paged kernels' signature (kernels/registry.py).

    A slab ``[lanes, L, kv_heads, head_dim]`` is a block pool whose blocks are one sequence's
    lane of ``L`` tokens: ``block_tables`` ``[B, 1]`` names each sequence's lane (its K/V
    are gathered: a copy), or is None when sequence ``b`` is lane ``b`` (a view: SDPA alone
    reads the slab). Keys past ``context_lens[b]`` are masked; ``context_lens`` None means
    every sequence holds ``max_context`` keys (default ``L``), and SDPA runs without a mask.
    ``out`` receives a copy of the result (SDPA writes no caller's buffer); ``validate`` has
    nothing to check that SDPA does not. A quantized slab (``scales``, kernels/quant.py: per-token
    ones ``[lanes, L, kv_heads]``) is dequantized to q's dtype before SDPA: a copy, timed with the call.
    ``window`` > 0 (a sliding-window layer's, in tokens) masks keys before ``context_lens[b] - window``;
    without ``context_lens`` the slab is cut to its last ``window`` keys instead (a view).
    ``sinks`` ``[heads]``: attention sinks (kernels/sinks.py), through ``sink_sdpa``.
    """
    length = k_slab.shape[1] if max_context is None else max_context
    first = max(0, length - window) if window > 0 and context_lens is None else 0
    keys, values = k_slab[:, first:length], v_slab[:, first:length]  # views: sliced before any gather
    k_scale = v_scale = None
    if scales is not None:
        k_scale, v_scale = ((s[:, first:length] if s.dim() else s) for s in (scales.k, scales.v))
    if block_tables is not None:  # the gather copies only the `length` tokens read, not whole lanes
        lanes = block_tables[:, 0].long()
        keys, values = keys.index_select(0, lanes), values.index_select(0, lanes)
        if scales is not None and scales.dynamic:
            k_scale, v_scale = k_scale.index_select(0, lanes), v_scale.index_select(0, lanes)
    if scales is not None:
        from kvbench.kernels.quant import dequantize

        keys, values = dequantize(keys, k_scale, q.dtype), dequantize(values, v_scale, q.dtype)
    mask = None
    if context_lens is not None:
        pos, lens = torch.arange(length, device=q.device)[None, :], context_lens.to(q.device)[:, None]
        visible = pos < lens
        if window > 0:
            visible = visible & (pos >= lens - window)
        mask = visible[:, None, None, :]
    # Fixed shapes per call site (the kernel scenario): SDPA picks among all its backends.
    if sinks is not None:
        res = sink_sdpa(q.unsqueeze(2), keys.transpose(1, 2), values.transpose(1, 2), scale, mask, sinks).squeeze(2)
    else:
        res = grouped_sdpa(q.unsqueeze(2), keys.transpose(1, 2), values.transpose(1, 2), scale, mask=mask).squeeze(2)
    return res if out is None else out.copy_(res)
