"""Store new K/V rows into the paged cache in Triton (layout in kernels/reference.py).

One program per tile of tokens; a token's whole row (all kv heads x head_dim) is one
contiguous cache row, so each program does one masked gather from key/value (which may
be strided between heads) and one contiguous store. Slots < 0 are skipped.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kernels.validate import KernelArgumentError, check_write_args

__all__ = ["write_kv_triton"]


# num_tokens (1 at batch 1, else anything) and the strides are not specialised on, so
# one variant serves every batch size and prompt length of a model.
@triton.jit(do_not_specialize=["num_tokens", "stride_kt", "stride_kh", "stride_vt", "stride_vh"])
def _write_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, num_tokens,
    stride_kt, stride_kh, stride_vt, stride_vh,
    HEAD_DIM: tl.constexpr, ROW: tl.constexpr, ROW_PAD: tl.constexpr, BLOCK_T: tl.constexpr,
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
    tl.store(k_cache_ptr + dst, k, mask=mask)
    v = tl.load(value_ptr + tok * stride_vt + (head * stride_vh + d)[None, :], mask=mask)
    tl.store(v_cache_ptr + dst, v, mask=mask)


def write_kv_triton(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    validate: bool = True,
) -> None:
    """Store ``key``/``value`` rows ``[tokens, kv_heads, head_dim]`` into their slots, in place.

    ``validate=False`` skips the argument checks: for a caller that already checked
    tensors of these shapes (a KV cache checks the first layer of a step).
    """
    interpreting = os.environ.get("TRITON_INTERPRET", "0") == "1"
    if validate:
        check_write_args(key, value, k_cache, v_cache, slot_mapping)
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
    _write_kv_kernel[(triton.cdiv(num_tokens, block_t),)](
        key, value, k_cache, v_cache, slot_mapping, num_tokens,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        HEAD_DIM=head_dim, ROW=row, ROW_PAD=row_pad, BLOCK_T=block_t, num_warps=4,
    )
