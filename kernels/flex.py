"""Paged decode attention by torch's FlexAttention over the block tables: the field's reference kernel.

Two paths (kernels/flex_mode.py picks one per device):

- ``compiled`` (a GPU; on CPU by ``KVBENCH_FLEX_MODE=compiled``): ``torch.compile(flex_attention)`` over
  the pool itself. The pool ``[num_blocks, block_size, kv_heads, head_dim]`` is viewed, without a copy,
  as one key sequence of ``num_blocks * block_size`` slots; each sequence's page table becomes a
  ``BlockMask`` row whose kv block is one page and whose kv indices are its physical blocks (as torch's
  ``experimental/_paged_attention.py`` maps a logical sequence onto pages, without its physical-to-logical
  table: ``pool_block_mask``). Pages wholly inside the sequence's window are "full" (no mask evaluated);
  its first and last are partial, masked by slot offset. The fused kernel reads only the listed pages.
- ``eager`` (CPU): flex's math path scores the query against every key it is given, whatever the block
  mask says, and copies K/V ``heads // kv_heads`` times for GQA; over the pool a decode would cost the
  whole pool (a CPU run's pool holds ~50K slots: 0.4 s a layer). So eager gathers each sequence's pages
  through its block table first (only a window's pages in a sliding layer), as the torch reference does,
  and flex masks the logical positions. No compile, and it returns the log-sum-exp sinks need.

Sinks (a learned logit per head in the softmax denominator): flex has no virtual column, so the output
is rescaled by ``sum / (sum + exp(sink)) = sigmoid(lse - sink)`` with flex's natural-log ``lse``.
Inductor's CPU template returns no lse: a call with sinks runs eager there.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable

import torch

from kvbench.kernels.flex_mode import MODES, flex_mode
from kvbench.kernels.sinks import check_sinks
from kvbench.kernels.validate import KernelArgumentError

# The block mask's query tile: flex's default. A decode has one query row; the GPU decoding kernel needs the
# tile to be a multiple of its BLOCK_M, which a tile of 1 is not.
Q_TILE = 128


def _flex_plain(q, k, v, block_mask, scale, enable_gqa):
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa)


def _flex_lse(q, k, v, block_mask, scale, enable_gqa, return_aux):
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa, return_aux=return_aux)


@lru_cache(maxsize=None)
def _compiled(sinks: bool) -> Callable[..., torch.Tensor]:
    # Static shapes: the GPU's decoding kernel needs a static batch (a dynamic one falls back to the prefill
    # kernel). Dynamo recompiles one function at most 8 times by default, then runs it eagerly (the math path
    # over the whole pool): the shapes are kept to a few (``_bucket``, the mask's rows as long as the pool),
    # and the sinks variant (it returns the lse) is a function of its own, with its own 8.
    return torch.compile(_flex_lse if sinks else _flex_plain, dynamic=False)


def _bucket(batch: int) -> int:
    """The compiled path's batch: a power of two, at least 8: batches up to 1024 compile 8 shapes."""
    return max(8, 1 << (batch - 1).bit_length())


def _eager_flex() -> Callable[..., torch.Tensor]:
    import torch.nn.attention.flex_attention as fa

    # Eager is this kernel's chosen CPU path, not a slip: flex's once-per-process "use torch.compile"
    # warning would only repeat what this module documents.
    fa._WARNINGS_SHOWN.add("flex_attention_performance")
    return fa.flex_attention


def _window(context_lens: torch.Tensor, window: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's context length and its oldest visible position (``len - window``; 0 without a window)."""
    lens = context_lens.to(device=device, dtype=torch.long)
    first = (lens - window).clamp(min=0) if window > 0 else torch.zeros_like(lens)
    return lens, first


def pool_block_mask(block_tables: torch.Tensor, context_lens: torch.Tensor, num_blocks: int, block_size: int,
                    width: int, window: int = 0):
    """The ``BlockMask`` of one decode query per sequence over the pool viewed as one key sequence.

    Row ``b`` lists the physical blocks of logical blocks ``first // bs .. (len - 1) // bs`` of
    ``block_tables[b]``; ``width`` columns of the table are read (entries past a sequence's last block
    are never used). The index rows are ``num_blocks`` long, whatever the batch's longest table: one
    shape for a run (and inductor's CPU template requires the mask to span the key sequence).

    ``mask_mod`` masks the slots of a row's first and last listed blocks outside ``[first, len)``, by
    their physical block id: a sequence's live blocks are distinct, and a compiled kernel evaluates the
    mask on listed blocks only (flex's eager math path, which evaluates it on every slot, never gets it).
    """
    from torch.nn.attention.flex_attention import BlockMask

    device = block_tables.device
    lens, first = _window(context_lens, window, device)
    logical = torch.arange(width, device=device)[None, :]
    lo, hi = first // block_size, (lens - 1) // block_size
    used = (logical >= lo[:, None]) & (logical <= hi[:, None])
    # Full blocks: every slot inside [first, len). A one-block range has none.
    full = used & (logical * block_size >= first[:, None]) & ((logical + 1) * block_size <= lens[:, None])
    table = torch.where(used, block_tables[:, :width].long(), 0)

    def listed(keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # The kept entries first, in logical order (a stable sort): [B, 1, 1] counts, [B, 1, 1, num_blocks] indices.
        order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)
        indices = torch.nn.functional.pad(table.gather(1, order).to(torch.int32), (0, max(0, num_blocks - width)))
        return keep.sum(1).to(torch.int32)[:, None, None], indices[:, None, None]

    # The first and last listed blocks, and the slots of each that are in: offsets >= first's, < last's.
    first_block, last_block = table.gather(1, lo[:, None])[:, 0], table.gather(1, hi[:, None])[:, 0]
    first_in, last_end = first - lo * block_size, lens - hi * block_size

    def mask_mod(b, h, q_idx, kv_idx):
        block, offset = kv_idx // block_size, kv_idx % block_size
        return (((block != first_block[b]) | (offset >= first_in[b]))
                & ((block != last_block[b]) | (offset < last_end[b])))

    kv_num, kv_indices = listed(used & ~full)
    full_num, full_indices = listed(full)
    return BlockMask.from_kv_blocks(kv_num, kv_indices, full_num, full_indices, BLOCK_SIZE=(Q_TILE, block_size),
                                    mask_mod=mask_mod, seq_lengths=(1, num_blocks * block_size),
                                    compute_q_blocks=False)


def gathered_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                context_lens: torch.Tensor, width: int, window: int = 0):
    """The eager path's keys: each sequence's pages gathered through its table, ``[B, kv_heads, span * bs, D]``
    K and V, and the ``BlockMask`` of their logical positions. ``span`` blocks from the block of the oldest
    visible key: ``width`` without a window, the most blocks a window can touch with one."""
    from torch.nn.attention.flex_attention import BlockMask

    device = block_tables.device
    batch = block_tables.shape[0]
    _, block_size, kv_heads, head_dim = k_cache.shape
    lens, first = _window(context_lens, window, device)
    span = min(width, (window - 1) // block_size + 2) if window > 0 else width
    start = first // block_size  # each row's first gathered logical block
    cols = start[:, None] + torch.arange(span, device=device)[None, :]
    live = cols <= (lens[:, None] - 1) // block_size  # past the last block: junk ids, never read
    blocks = torch.where(live, block_tables.long().gather(1, cols.clamp(max=block_tables.shape[1] - 1)), 0)

    def gather(cache: torch.Tensor) -> torch.Tensor:
        rows = cache.index_select(0, blocks.flatten()).view(batch, span, block_size, kv_heads, head_dim)
        return rows.permute(0, 3, 1, 2, 4).reshape(batch, kv_heads, span * block_size, head_dim)

    def mask_mod(b, h, q_idx, kv_idx):
        pos = start[b] * block_size + kv_idx
        return (pos < lens[b]) & (pos >= first[b])

    kv_num = torch.full((batch, 1, 1), span, dtype=torch.int32, device=device)
    kv_indices = torch.arange(span, dtype=torch.int32, device=device).expand(batch, 1, 1, span)
    mask = BlockMask.from_kv_blocks(kv_num, kv_indices, BLOCK_SIZE=(Q_TILE, block_size), mask_mod=mask_mod,
                                    seq_lengths=(1, span * block_size), compute_q_blocks=False)
    return gather(k_cache), gather(v_cache), mask


def _check(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
           context_lens: torch.Tensor, sinks: torch.Tensor | None) -> None:
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise KernelArgumentError(f"flex decode takes q [batch, heads, head_dim] and k/v caches [blocks, block_size, "
                                  f"kv_heads, head_dim], got q {tuple(q.shape)}, k {tuple(k_cache.shape)}, "
                                  f"v {tuple(v_cache.shape)}")
    heads, kv_heads = q.shape[1], k_cache.shape[2]
    if heads % kv_heads or q.shape[2] != k_cache.shape[3]:
        raise KernelArgumentError(f"flex decode: q heads {heads} / head_dim {q.shape[2]} do not fit kv_heads "
                                  f"{kv_heads} / head_dim {k_cache.shape[3]}")
    if q.dtype != k_cache.dtype:
        raise KernelArgumentError(f"flex decode reads a cache of q's dtype {q.dtype}, got {k_cache.dtype}")
    if block_tables.shape[0] != q.shape[0] or context_lens.shape != (q.shape[0],):
        raise KernelArgumentError(f"flex decode: block_tables {tuple(block_tables.shape)} and context_lens "
                                  f"{tuple(context_lens.shape)} do not match batch {q.shape[0]}")
    check_sinks(sinks, heads, q.device)


def flex_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                context_lens: torch.Tensor, scale: float, out: torch.Tensor | None = None, *,
                max_context: int | None = None, validate: bool = True, scales=None, window: int = 0,
                sinks: torch.Tensor | None = None, mode: str | None = None) -> torch.Tensor:
    """One query token per sequence, ``q [batch, heads, head_dim]`` -> same shape (kernels/reference.py).

    ``mode``: ``eager`` or ``compiled`` (None: ``flex_mode`` of q's device). ``scales`` (a quantized
    cache) is refused: the registry lists this kernel as reading float caches only.
    """
    if scales is not None:
        raise KernelArgumentError("kernel flex reads kv_dtype auto only (a float cache), got a quantized one's scales")
    if validate:
        _check(q, k_cache, v_cache, block_tables, context_lens, sinks)
    mode = mode or flex_mode(q.device.type)
    if mode not in MODES:
        raise ValueError(f"flex mode {mode!r}: allowed {', '.join(MODES)}")
    if mode == "compiled" and sinks is not None and q.device.type != "cuda":
        mode = "eager"  # inductor's CPU template returns no lse
    num_blocks, block_size, kv_heads, head_dim = k_cache.shape
    width = block_tables.shape[1] if max_context is None else min(block_tables.shape[1], -(-max_context // block_size))
    batch = q.shape[0]
    if mode == "compiled" and _bucket(batch) > batch:
        # Padding rows read one slot of block 0 (context 1) and are dropped after.
        pad = _bucket(batch) - batch
        q = torch.cat([q, q.new_zeros(pad, *q.shape[1:])])
        block_tables = torch.cat([block_tables[:, :width], block_tables.new_zeros(pad, width)])
        context_lens = torch.cat([context_lens, context_lens.new_ones(pad)])
    if mode == "compiled":
        mask = pool_block_mask(block_tables, context_lens, num_blocks, block_size, width, window)
        # [1, kv_heads, slots, head_dim] views of the pool: the kernel reads the listed pages in place
        k = k_cache.view(1, num_blocks * block_size, kv_heads, head_dim).transpose(1, 2)
        v = v_cache.view(1, num_blocks * block_size, kv_heads, head_dim).transpose(1, 2)
        fn = _compiled(sinks is not None)
    else:
        k, v, mask = gathered_kv(k_cache, v_cache, block_tables, context_lens, width, window)
        fn = _eager_flex()
    options = {}
    if sinks is not None:
        from torch.nn.attention.flex_attention import AuxRequest

        options["return_aux"] = AuxRequest(lse=True)
    res = fn(q.unsqueeze(2), k, v, block_mask=mask, scale=scale, enable_gqa=True, **options)
    if sinks is None:
        res = res.squeeze(2)[:batch]
    else:
        res, aux = res
        keep = torch.sigmoid(aux.lse.squeeze(2).float() - sinks.float()[None, :])  # [B, H]: sum / (sum + e^sink)
        res = (res.squeeze(2).float() * keep[..., None]).to(q.dtype)[:batch]
    return res if out is None else out.copy_(res)
