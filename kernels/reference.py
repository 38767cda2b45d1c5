"""Pure-torch paged attention: the oracle every kernel is tested against.

Layout shared by every paged impl and kernel:
  k_cache, v_cache : [num_blocks, block_size, kv_heads, head_dim]
  block_tables     : int32 [batch, max_blocks_per_seq]; entries past a sequence's
                     last block are ignored (any value)
  context_lens     : int32 [batch], tokens of K/V each sequence attends over (>= 1)
  slot_mapping     : int64 [tokens]; slot = block * block_size + offset; < 0 skips
  scales           : a quantized cache's (fp8 / int8 stores) K and V scales (kernels/quant.py);
                     None for a float cache
  window           : a sliding-window layer's window in tokens; <= 0 = none. The query at
                     position p = context_len - 1 reads keys p - window + 1 .. p (transformers'
                     ``sliding_window``: ``kv_idx > q_idx - window``); older keys are masked
  sinks            : float32 [num_heads] attention sinks (kernels/sinks.py), a logit per query head
                     in every softmax's denominator with no value; None = none
"""

from __future__ import annotations

import torch

from kvbench.kernels.quant import KVScales, dequantize, write_quantized_ref


def write_kv_ref(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    may_skip: bool = True,
    scales: KVScales | None = None,
) -> None:
    """Store key/value rows ``[tokens, kv_heads, head_dim]`` into their slots, in place.

    ``may_skip=False`` is the caller's word that no slot is < 0 (a KV cache computed
    them on the host), and a plain scatter does. Otherwise no boolean indexing either:
    selecting the kept rows sizes a tensor by their count, a device-to-host sync in
    every layer. A skipped token repeats the write of a kept token instead (same slot,
    same row, so the duplicate is harmless whichever lands last); when no token is
    kept, every row rewrites slot 0 with its own contents.
    """
    if slot_mapping.numel() == 0:
        return
    if scales is not None:
        if may_skip:  # boolean indexing (a sync): the oracle's skip path only, no cache takes it
            keep = slot_mapping >= 0
            key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
        write_quantized_ref(key, value, k_cache, v_cache, slot_mapping, scales)
        return
    if not may_skip:
        for rows, cache in ((key, k_cache), (value, v_cache)):
            cache.view(-1, *cache.shape[2:])[slot_mapping] = rows.to(cache.dtype)
        return
    keep = slot_mapping >= 0
    kept = slot_mapping.argmax(dim=0, keepdim=True)  # the largest slot: a kept token, unless none is
    src = torch.where(keep, torch.arange(keep.shape[0], device=keep.device), kept)
    slots = slot_mapping[src]
    any_kept = slots[:1, None, None] >= 0  # slots are now all >= 0, or all < 0
    slots = slots.clamp(min=0)
    for rows, cache in ((key, k_cache), (value, v_cache)):
        flat = cache.view(-1, *cache.shape[2:])
        flat[slots] = torch.where(any_kept, rows.index_select(0, src).to(cache.dtype), flat[:1])


def gather_kv(
    cache: torch.Tensor, block_table: torch.Tensor, context_len: int,
    scale: torch.Tensor | None = None, dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The first ``context_len`` rows of one sequence: ``[context_len, kv_heads, head_dim]``.

    A quantized cache's rows come back dequantized to ``dtype`` with their ``scale`` (its K or V
    scale of a ``KVScales``)."""
    block_size = cache.shape[1]
    num_blocks = (context_len + block_size - 1) // block_size
    blocks = block_table[:num_blocks]
    rows = cache.index_select(0, blocks).flatten(0, 1)[:context_len]  # whole blocks, one run each
    if scale is None:
        return rows
    if scale.dim():
        scale = scale.index_select(0, blocks).flatten(0, 1)[:context_len]
    return dequantize(rows, scale, dtype)


def paged_decode_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    max_context: int | None = None,
    scales: KVScales | None = None,
    window: int = 0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query token per sequence: ``q [batch, heads, head_dim]`` -> same shape.

    Batched (no per-sequence loop, so the ``paged_torch`` impl can run on it):
    gathers every sequence's blocks, masks rows past its context length,
    computes scores and softmax in fp32 and casts back to ``q.dtype``.
    Grouped-query attention: query head ``h`` reads KV head ``h // (heads // kv_heads)``.
    ``max_context`` is ``context_lens.max()`` when the caller knows it on the host
    (a KV cache does); without it, reading it is a device-to-host sync.
    A quantized cache (``scales``) is dequantized to fp32 as it is gathered.
    ``window`` > 0 masks keys older than the window (the oracle still gathers them).
    ``sinks`` adds each head's sink as one more score column, dropped after the softmax.
    """
    batch, num_heads, head_dim = q.shape
    num_blocks, block_size, kv_heads, _ = k_cache.shape
    group = num_heads // kv_heads
    max_len = max_context if max_context is not None else int(context_lens.max())
    width = (max_len + block_size - 1) // block_size
    blocks = block_tables[:, :width].long().clamp(0, num_blocks - 1).flatten()

    def gather(cache: torch.Tensor, cache_scale: torch.Tensor | None) -> torch.Tensor:
        # Whole blocks (index_select copies each as one run), then one copy into
        # [B, KVH, width * block_size, D]: both products below are then plain batched
        # matmuls, where an einsum over the gathered [B, L, KVH, D] would copy K and V
        # again to bring the kv heads forward.
        rows = cache.index_select(0, blocks).view(batch, width, block_size, kv_heads, head_dim)
        rows = rows.permute(0, 3, 1, 2, 4).reshape(batch, kv_heads, width * block_size, head_dim)
        if cache_scale is None:
            return rows.float()
        if cache_scale.dim():
            cache_scale = cache_scale.index_select(0, blocks).view(batch, width, block_size, kv_heads)
            cache_scale = cache_scale.permute(0, 3, 1, 2).reshape(batch, kv_heads, width * block_size)
        return dequantize(rows, cache_scale)

    k = gather(k_cache, None if scales is None else scales.k)
    v = gather(v_cache, None if scales is None else scales.v)
    qg = q.float().view(batch, kv_heads, group, head_dim)
    # K @ q^T, not q @ K^T: with the just-gathered K as the transposed right operand,
    # the CPU GEMM path measured ~30% slower in a decode loop (this is paged_torch's
    # whole attention on CPU).
    scores = (k @ qg.transpose(-1, -2)).transpose(-1, -2) * scale  # [B, KVH, G, L]
    pos = torch.arange(k.shape[2], device=q.device)
    lens = context_lens.to(q.device)[:, None].long()
    pad = pos[None, :] >= lens  # [B, L]
    if window > 0:
        pad = pad | (pos[None, :] < lens - window)
    scores = scores.masked_fill(pad[:, None, None, :], float("-inf"))
    if sinks is not None:  # a virtual key of score sink and value 0: in the denominator only
        sink = sinks.float().view(1, kv_heads, group, 1).expand(batch, -1, -1, 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    out = probs @ v  # [B, KVH, G, D]
    return out.reshape(batch, num_heads, head_dim).to(q.dtype)
