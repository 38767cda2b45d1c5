"""Store new K/V rows into the paged cache in Triton (layout in kernels/reference.py).

One program per tile of tokens; a token's whole row (all kv heads x head_dim) is one
contiguous cache row, so each program does one masked gather from key/value (which may
be strided between heads) and one contiguous store. Slots < 0 are skipped.
"""

from __future__ import annotations

import os

import torch
from kvbench.kernels import triton_mode  # noqa: F401  (the interpreter switch, before triton)
import triton
import triton.language as tl

from kvbench.kernels.quant import MIN_SCALE, KVScales
from kvbench.kernels.triton_quant import qmax_of, quant_code, quantize_tile, storage_view
from kvbench.kernels.validate import QUANTIZED_DTYPES, KernelArgumentError, check_write_args

__all__ = ["write_kv_triton"]


# num_tokens (1 at batch 1, else anything) and the strides are not specialised on, so
# one variant serves every batch size and prompt length of a model.
@triton.jit
def _quantized_rows(x, mask, head, scale_ptr, slot, QUANT: tl.constexpr, QMAX: tl.constexpr,
                    DYNAMIC: tl.constexpr, KV_HEADS: tl.constexpr, MIN_S: tl.constexpr):
    """A tile of rows [BLOCK_T, ROW_PAD] quantized; dynamic: each (token, head)'s scale stored at its slot."""
    x = x.to(tl.float32)
    if DYNAMIC:
        ax = tl.where(mask, tl.abs(x), 0.0)
        scales = tl.full(x.shape, 1.0, tl.float32)
        for h in tl.static_range(KV_HEADS):  # one amax per head over its head_dim columns
            in_head = (head == h)[None, :]
            s_h = tl.maximum(tl.max(tl.where(in_head, ax, 0.0), axis=1) / QMAX, MIN_S)
            tl.store(scale_ptr + slot * KV_HEADS + h, s_h, mask=slot >= 0)
            scales = tl.where(in_head, s_h[:, None], scales)
        return quantize_tile(x / scales, QUANT, QMAX)
    else:
        return quantize_tile(x / tl.load(scale_ptr), QUANT, QMAX)


@triton.jit(do_not_specialize=["num_tokens", "stride_kt", "stride_kh", "stride_vt", "stride_vh"])
def _write_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, num_tokens,
    stride_kt, stride_kh, stride_vt, stride_vh,
    k_scale_ptr, v_scale_ptr,  # a quantized cache's fp32 scales; unused when not QUANT
    HEAD_DIM: tl.constexpr, ROW: tl.constexpr, ROW_PAD: tl.constexpr, BLOCK_T: tl.constexpr,
    KV_HEADS: tl.constexpr, QUANT: tl.constexpr, QMAX: tl.constexpr, DYNAMIC: tl.constexpr,
    MIN_S: tl.constexpr,
):
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    slot = tl.load(slot_ptr + offs_t, mask=offs_t < num_tokens, other=-1)
    cols = tl.arange(0, ROW_PAD)  # kv_head * HEAD_DIM + d
    head = cols // HEAD_DIM
    d = cols % HEAD_DIM
    mask = (slot >= 0)[:, None] & (cols < ROW)[None, :]
    tok = offs_t.to(tl.int64)[:, None]
    dst = slot[:, None] * ROW + cols[None, :]
    k = tl.load(key_ptr + tok * stride_kt + (head * stride_kh + d)[None, :], mask=mask)
    v = tl.load(value_ptr + tok * stride_vt + (head * stride_vh + d)[None, :], mask=mask)
    if QUANT != 0:
        k = _quantized_rows(k, mask, head, k_scale_ptr, slot, QUANT, QMAX, DYNAMIC, KV_HEADS, MIN_S)
        v = _quantized_rows(v, mask, head, v_scale_ptr, slot, QUANT, QMAX, DYNAMIC, KV_HEADS, MIN_S)
    tl.store(k_cache_ptr + dst, k, mask=mask)
    tl.store(v_cache_ptr + dst, v, mask=mask)


def write_kv_triton(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    validate: bool = True,
    scales: KVScales | None = None,
) -> None:
    """Store ``key``/``value`` rows ``[tokens, kv_heads, head_dim]`` into their slots, in place.

    A quantized cache (kernels/quant.py) comes with its ``scales``: the rows are quantized with
    the static ones, or (dynamic) each (token, head) gets its amax's scale, stored at its slot.

    ``validate=False`` skips the argument checks: for a caller that already checked
    tensors of these shapes (a KV cache checks the first layer of a step).
    """
    interpreting = os.environ.get("TRITON_INTERPRET", "0") == "1"
    if validate:
        check_write_args(key, value, k_cache, v_cache, slot_mapping, scales=scales, quantized=QUANTIZED_DTYPES)
        if not interpreting and key.device.type != "cuda":
            raise KernelArgumentError(f"key is on {key.device}: compiled Triton kernels need CUDA tensors "
                                      "(CPU tensors run only under TRITON_INTERPRET=1)")
    num_tokens, kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    row = kv_heads * head_dim
    row_pad = triton.next_power_of_2(row)
    # ~8K elements per program on GPU; the interpreter pays per program, so take more.
    # A function of the row shape alone, never of num_tokens: one compiled variant.
    budget = 1 << 16 if interpreting else 1 << 13
    block_t = max(1, budget // row_pad)
    quant = quant_code(k_cache.dtype)
    k_scale, v_scale = (scales.k, scales.v) if scales is not None else (slot_mapping, slot_mapping)  # unused
    _write_kv_kernel[(triton.cdiv(num_tokens, block_t),)](
        key, value, storage_view(k_cache), storage_view(v_cache), slot_mapping, num_tokens,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1), k_scale, v_scale,
        HEAD_DIM=head_dim, ROW=row, ROW_PAD=row_pad, BLOCK_T=block_t, KV_HEADS=kv_heads,
        QUANT=quant, QMAX=qmax_of(quant) if quant else 1.0, DYNAMIC=scales is not None and scales.dynamic,
        MIN_S=MIN_SCALE, num_warps=4,
    )
