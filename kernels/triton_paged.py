"""Paged decode attention in Triton (flash-decoding), over the layout in kernels/reference.py.

One query token per sequence. One program per (sequence, kv_head[, split]) loads each
K/V tile once for every query head of its group, so grouped-query attention reads the
cache once, not ``group`` times. A tile of ``BLOCK_N`` tokens may span many pages: each
token finds its page through the block table, so 1-token pages still give big tiles.

Split-K: when ``batch * kv_heads`` programs cannot fill the GPU, each sequence's context
is cut into ``num_splits`` ranges; each writes a partial (max, sum, unnormalised acc) to
fp32 scratch and ``_combine_splits_kernel`` merges them. With one split the first
kernel writes the output directly (no scratch traffic).

A head_dim that is not a power of two is padded to the next one in registers (masked loads): MLA's latent
(576 values as one kv head, harness/model/deepseek.py) runs as 1024 lanes, 44% of them idle, and its group of
every query head (128 for DeepSeek-V3) makes a [128, 1024] fp32 accumulator per program: more registers than a GPU
program keeps, so it spills (a kernel shaped for MLA, as FlashMLA is, tiles the heads and the latent).

Import as ``kernels.triton_paged`` (the package turns on the interpreter on CPU).
"""

from __future__ import annotations

import functools
import os

import torch
from kvbench.kernels import triton_mode  # noqa: F401  (the interpreter switch, before triton)
import triton
import triton.language as tl

from kvbench.kernels.quant import KVScales
from kvbench.kernels.sinks import check_sinks
from kvbench.kernels.triton_quant import dequantize_tile, quant_code, storage_view
from kvbench.kernels.triton_write import write_kv_triton
from kvbench.kernels.validate import QUANTIZED_DTYPES, KernelArgumentError, check_decode_args

__all__ = ["paged_decode_attention_triton", "write_kv_triton", "choose_num_splits"]

_LOG2E = 1.4426950408889634
MIN_TOKENS_PER_SPLIT = 256  # four 64-token tiles: below this a split's fixed cost outweighs its parallelism
PROGRAMS_PER_SM = 4
MAX_SPLITS = 32

# tl.max / tl.sum are themselves @jit functions, and the interpreter re-patches all of
# triton.language on every nested jit call (~0.4 ms each). tl.reduce with the same
# combine functions compiles identically on GPU and maps to numpy in the interpreter.
_max_combine = tl.standard._elementwise_max
_sum_combine = tl.standard._sum_combine


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# Integers that change from step to step (the block-table width, the split count) are
# not specialised on: Triton would otherwise compile a new variant for a value of 1 or a
# multiple of 16 in the middle of a measured run. Only SPLIT (one split or several)
# selects code, so a model has two decode variants, both compiled by the warm-up.
_RUNTIME_INTS = ["stride_qb", "stride_qh", "stride_ob", "stride_oh", "stride_bt", "num_splits", "window"]


@triton.jit(do_not_specialize=_RUNTIME_INTS)
def _decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, out_ptr,
    m_ptr, l_ptr, acc_ptr,  # split scratch; unused when not SPLIT
    k_scale_ptr, v_scale_ptr,  # a quantized cache's fp32 scales; unused when not QUANT
    sinks_ptr,  # fp32 [heads] attention sinks (kernels/sinks.py); read only when SINK
    scale_log2,  # softmax scale * log2(e): scores live in base 2 so exp2 is used
    stride_qb, stride_qh, stride_ob, stride_oh, stride_bt, num_splits,
    window,  # a sliding-window layer's window in tokens; read only when SLIDE
    KV_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr,
    QUANT: tl.constexpr, DYNAMIC: tl.constexpr,  # kernels/triton_quant.py codes; DYNAMIC: per token and head
    SLIDE: tl.constexpr,  # a window: the key loop starts at its first key (a full layer's code is unchanged)
    SINK: tl.constexpr,  # sinks: the running max and sum start at the sink's (a layer without has the same code)
):
    # Index math in int64: no overflow on big caches, and the interpreter skips its
    # per-op int32 overflow checks (several numpy ops each).
    seq = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2).to(tl.int64)

    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_PAD)
    g_mask = offs_g < GROUP
    heads = kvh * GROUP + offs_g  # query heads of this group
    if HEAD_DIM == HEAD_PAD:
        gd_mask = g_mask[:, None]
    else:
        gd_mask = g_mask[:, None] & (offs_d < HEAD_DIM)[None, :]

    q = tl.load(q_ptr + seq * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=gd_mask, other=0.0)
    if UPCAST_DOT:
        q = q.to(tl.float32)

    end = tl.load(context_lens_ptr + seq).to(tl.int64)
    start = end * 0
    if SLIDE:  # keys before end - window are never loaded: a window reads at most `window` keys
        start = tl.maximum(end - window, 0)
    if SPLIT:  # this split's whole tiles: [start, end)
        if SLIDE:
            span = ((end - start + BLOCK_N - 1) // BLOCK_N + num_splits - 1) // num_splits * BLOCK_N
            start = start + split * span
        else:
            span = ((end + BLOCK_N - 1) // BLOCK_N + num_splits - 1) // num_splits * BLOCK_N
            start = split * span
        end = tl.minimum(start + span, end)

    # tl.full, not tl.zeros: the latter is a nested @jit call (slow in the interpreter).
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.full([GROUP_PAD], 0.0, tl.float32)
    if SINK:  # a virtual key of score sink, value 0: max = sink, sum = exp(0); once a sequence (split 0's)
        first = split == 0
        m_i = tl.where(first, tl.load(sinks_ptr + heads, mask=g_mask, other=0.0) * 1.4426950408889634, m_i)
        l_i = tl.where(first, 1.0, l_i)
    acc = tl.full([GROUP_PAD, HEAD_PAD], 0.0, tl.float32)
    if QUANT != 0 and not DYNAMIC:  # static per-tensor scales: two loads per program
        k_s = tl.load(k_scale_ptr)
        v_s = tl.load(v_scale_ptr)
    table = block_tables_ptr + seq * stride_bt
    k_base = k_cache_ptr + kvh * HEAD_DIM + offs_d[None, :]
    v_base = v_cache_ptr + kvh * HEAD_DIM + offs_d[None, :]
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        valid = offs_n < end
        block = tl.load(table + offs_n // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
        row = (block * BLOCK_SIZE + offs_n % BLOCK_SIZE)[:, None] * (KV_HEADS * HEAD_DIM)
        if HEAD_DIM == HEAD_PAD:
            kv_mask = valid[:, None]
        else:
            kv_mask = valid[:, None] & (offs_d < HEAD_DIM)[None, :]
        if QUANT == 0:
            k = tl.load(k_base + row, mask=kv_mask, other=0.0)
            v = tl.load(v_base + row, mask=kv_mask, other=0.0)
        else:  # one byte per element from memory, dequantized in registers to q's dtype
            k = dequantize_tile(tl.load(k_base + row, mask=kv_mask, other=0), QUANT)
            v = dequantize_tile(tl.load(v_base + row, mask=kv_mask, other=0), QUANT)
            if DYNAMIC:
                srow = (block * BLOCK_SIZE + offs_n % BLOCK_SIZE) * KV_HEADS + kvh
                k = k * tl.load(k_scale_ptr + srow, mask=valid, other=0.0)[:, None]
                v = v * tl.load(v_scale_ptr + srow, mask=valid, other=0.0)[:, None]
            else:
                k = k * k_s
                v = v * v_s
            k = k.to(q_ptr.dtype.element_ty)
            v = v.to(q_ptr.dtype.element_ty)
        if UPCAST_DOT:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2  # [G, N]
        s = tl.where(valid[None, :], s, float("-inf"))
        # Every tile holds >= 1 valid token, so m_new is finite and exp2 never sees nan.
        m_new = tl.maximum(m_i, tl.reduce(s, 1, _max_combine))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.reduce(p, 1, _sum_combine)
        p = p.to(q_ptr.dtype.element_ty)  # P@V at q's precision (a float cache's), as on GPU
        if UPCAST_DOT:
            p = p.to(tl.float32)
            v = v.to(tl.float32)
        acc = tl.dot(p, v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new

    if not SPLIT:
        out = acc / l_i[:, None]
        tl.store(out_ptr + seq * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=gd_mask)
    else:
        # Scratch: m/l [batch, heads, splits], acc [batch, heads, splits, HEAD_DIM], fp32.
        part = (seq * (KV_HEADS * GROUP) + heads) * num_splits + split
        tl.store(m_ptr + part, m_i, mask=g_mask)
        tl.store(l_ptr + part, l_i, mask=g_mask)
        tl.store(acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=gd_mask)


@triton.jit(do_not_specialize=["stride_ob", "stride_oh", "num_splits"])
def _combine_splits_kernel(
    m_ptr, l_ptr, acc_ptr, out_ptr, stride_ob, stride_oh, num_splits,
    NUM_HEADS: tl.constexpr, SPLITS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_PAD)
    s_mask = offs_s < num_splits
    rows = (seq * NUM_HEADS + head) * num_splits + offs_s
    # Empty splits (context shorter than the split grid) hold m=-inf, l=0, acc=0;
    # split 0 is never empty, so the max is finite and their weight is exactly 0.
    m = tl.load(m_ptr + rows, mask=s_mask, other=float("-inf"))
    l = tl.load(l_ptr + rows, mask=s_mask, other=0.0)
    w = tl.exp2(m - tl.reduce(m, 0, _max_combine))
    acc = tl.load(acc_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :],
                  mask=s_mask[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    out = tl.reduce(acc * w[:, None], 0, _sum_combine) / tl.reduce(l * w, 0, _sum_combine)
    tl.store(out_ptr + seq * stride_ob + head * stride_oh + offs_d,
             out.to(out_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)


def compiled_variants() -> int:
    """Compiled variants of kvbench's Triton kernels in this process (0 in the interpreter).

    A measured run after warm-up must add none: a compile inside it would be timed.
    """
    from kvbench.kernels.triton_write import _write_kv_kernel

    total = 0
    for fn in (_decode_kernel, _combine_splits_kernel, _write_kv_kernel):
        for entry in getattr(fn, "device_caches", {}).values():
            total += len(entry[0])  # (kernel cache, key cache, target, backend, binder)
    return total


def choose_num_splits(batch: int, kv_heads: int, max_context: int, num_sms: int | None) -> int:
    """Split-K only when ``batch * kv_heads`` programs leave SMs idle and context is long.

    Then enough splits for about PROGRAMS_PER_SM programs on every SM (a K/V tile of
    32 KB lets four stay resident, so their loads overlap), never fewer than
    MIN_TOKENS_PER_SPLIT tokens per split, capped at MAX_SPLITS. Measured on an H200
    (batch 1, context 4096, 8 KV heads): 512-token splits (8) took 117 us where the
    contiguous SDPA took 54 us. ``num_sms=None`` (the CPU interpreter, which runs
    programs one after another) means 1.
    """
    programs = batch * kv_heads
    if num_sms is None or programs >= num_sms:
        return 1
    wanted = triton.cdiv(PROGRAMS_PER_SM * num_sms, programs)
    return max(1, min(wanted, max_context // MIN_TOKENS_PER_SPLIT, MAX_SPLITS))


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _block_n(head_dim_pad: int, max_context: int, num_splits: int) -> int:
    """Tokens per tile. GPU: 64 (32 for head_dim 256), so a K+V tile is 32 KB in bf16
    and 3 pipeline stages fit ~40 KB of smem at ~120 registers. Interpreter: it pays
    per op, not per element, so one tile per split up to 256 tokens (then it loops)."""
    if _interpreting():
        return min(256, max(16, triton.next_power_of_2(triton.cdiv(max_context, num_splits))))
    return 32 if head_dim_pad > 128 else 64


def paged_decode_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    *,
    max_context: int | None = None,
    validate: bool = True,
    scales: KVScales | None = None,
    window: int = 0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode attention, ``q [batch, heads, head_dim]`` -> ``out`` (same shape, q.dtype).

    ``window`` > 0 (a sliding-window layer's, in tokens) reads only each sequence's last ``window``
    keys (kernels/reference.py); <= 0: every key, the full-attention variant. ``sinks`` (float32 ``[heads]``,
    kernels/sinks.py) start split 0's running max at the sink and its sum at 1; None: the sink-free variant.

    A quantized cache (fp8 / int8 stores, kernels/quant.py) comes with its ``scales``; its
    bytes are read as they are and dequantized in registers.

    ``num_splits=None`` picks by ``choose_num_splits`` with the block-table width as
    the context bound (no device sync); an int forces that many splits.
    ``max_context`` (the longest ``context_lens`` entry, when the caller knows it)
    sizes the interpreter's tiles without reading ``context_lens``; the GPU path
    bounds the context by the table width either way. ``validate=False`` skips the
    argument checks: for a caller that already checked tensors of these shapes (a KV
    cache checks the first layer of a step).
    """
    interpreting = _interpreting()
    if validate:
        check_decode_args(q, k_cache, v_cache, block_tables, context_lens, out,
                          scales=scales, quantized=QUANTIZED_DTYPES, window=window)
        check_sinks(sinks, q.shape[1], q.device)
        if num_splits is not None and not (isinstance(num_splits, int) and num_splits >= 1):
            raise KernelArgumentError(f"num_splits must be a positive int or None, got {num_splits!r}")
        if not interpreting and q.device.type != "cuda":
            raise KernelArgumentError(f"q is on {q.device}: compiled Triton kernels need CUDA tensors "
                                      "(CPU tensors run only under TRITON_INTERPRET=1)")
    batch, num_heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    group = num_heads // kv_heads
    if out is None:
        out = torch.empty_like(q)
    if batch == 0:
        return out

    head_pad = triton.next_power_of_2(head_dim)
    if not interpreting:
        context_bound = block_tables.shape[1] * block_size  # upper bound, avoids a sync
        num_sms = _num_sms(q.device)
    else:
        context_bound = max_context if max_context is not None else int(context_lens.max())
        num_sms = None
    if window > 0:  # a window bounds what any sequence reads
        context_bound = min(context_bound, window)
    if num_splits is None:
        num_splits = choose_num_splits(batch, kv_heads, context_bound, num_sms)
    block_n = _block_n(head_pad, context_bound, num_splits)

    # Interpreter only: its tl.dot multiplies bf16 as raw uint16 bits, and numpy's fp16
    # matmul has no BLAS; fp32 operands (P still rounded to the cache dtype) fix both.
    upcast = interpreting and (q.dtype != torch.float32 or quant_code(k_cache.dtype) != 0)
    if num_splits == 1:
        m = l = acc = out  # placeholders: the kernel never touches them
    else:
        m = torch.empty(batch, num_heads, num_splits, dtype=torch.float32, device=q.device)
        l = torch.empty_like(m)
        acc = torch.empty(batch, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)

    quant = quant_code(k_cache.dtype)
    k_scale, v_scale = (scales.k, scales.v) if scales is not None else (out, out)  # placeholders when float
    _decode_kernel[(batch, kv_heads, num_splits)](
        q, storage_view(k_cache), storage_view(v_cache), block_tables, context_lens, out, m, l, acc,
        k_scale, v_scale, out if sinks is None else sinks,  # a placeholder without sinks
        scale * _LOG2E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0), num_splits, max(window, 0),
        KV_HEADS=kv_heads, GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim, HEAD_PAD=head_pad, BLOCK_SIZE=block_size, BLOCK_N=block_n,
        SPLIT=num_splits > 1,
        # fp32 caches get exact fp32 products (tl.dot defaults to tf32 on GPU).
        DOT_PRECISION="ieee" if q.dtype == torch.float32 or upcast else "tf32",
        UPCAST_DOT=upcast,
        QUANT=quant, DYNAMIC=scales is not None and scales.dynamic, SLIDE=window > 0, SINK=sinks is not None,
        # sm_90 compile (triton 3.9, bf16, head_dim 128, BLOCK_N 64): K/V tiles stream
        # through cp.async 3 deep, 126 registers, 39 KB smem -> 4 programs per SM, so
        # batch 64 x 8 kv heads is one resident wave. Untuned: sweep BLOCK_N 32-128,
        # warps 4/8, stages 2-4 on the device.
        num_warps=4, num_stages=3,
    )
    if num_splits > 1:
        _combine_splits_kernel[(batch, num_heads)](
            m, l, acc, out, out.stride(0), out.stride(1), num_splits,
            NUM_HEADS=num_heads, SPLITS_PAD=MAX_SPLITS,  # one variant for every split count
            HEAD_DIM=head_dim, HEAD_PAD=head_pad, num_warps=4,
        )
    return out
