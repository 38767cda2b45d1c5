"""Argument checks shared by every kernel wrapper: say what is wrong, by name.

The public wrappers run these on every call. A KV cache calls its kernel once per
layer with tensors of one shape, so it checks the first layer of a step and lets the
others skip (``validate=False``). Messages are lambdas, built only on failure: an
f-string over shapes costs microseconds, and the happy path formats none.
"""

from __future__ import annotations

from typing import Callable

import torch

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# The quantized stores (kernels/kv_formats.py), read only by kernels that take ``scales``.
QUANTIZED_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.int8)
# 576: MLA's latent as one kv head (DeepSeek-V2/V3, Kimi-K2: kv_lora_rank 512 + qk_rope_head_dim 64; FlashMLA's d),
# harness/model/deepseek.py. Triton pads it to 1024 lanes (its tiles are powers of two).
SUPPORTED_HEAD_DIMS = (64, 80, 96, 128, 256, 576)


class KernelArgumentError(ValueError):
    """A kernel was called with tensors it cannot take."""


def _require(cond: bool, msg: Callable[[], str]) -> None:
    if not cond:
        raise KernelArgumentError(msg())


def check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, scales=None,
                quantized: tuple[torch.dtype, ...] = ()) -> None:
    """``quantized``: the quantized store dtypes the calling kernel reads (with ``scales``, a
    kernels.quant.KVScales); a kernel that reads none refuses them, naming what it reads."""
    _require(k_cache.dim() == 4,
             lambda: f"k_cache must be [num_blocks, block_size, kv_heads, head_dim], got shape {tuple(k_cache.shape)}")
    _require(k_cache.shape == v_cache.shape,
             lambda: f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ in shape")
    _require(k_cache.dtype == v_cache.dtype, lambda: f"k_cache is {k_cache.dtype} but v_cache is {v_cache.dtype}")
    _require(k_cache.dtype in SUPPORTED_DTYPES + quantized,
             lambda: f"cache dtype {k_cache.dtype} not supported; this kernel reads {SUPPORTED_DTYPES + quantized}")
    is_quantized = k_cache.dtype in quantized
    _require(is_quantized == (scales is not None),
             lambda: f"a {k_cache.dtype} cache {'needs' if is_quantized else 'takes no'} scales (kernels/quant.py)")
    if scales is not None:
        want = tuple(k_cache.shape[:3]) if scales.dynamic else ()
        for name, s in (("k", scales.k), ("v", scales.v)):
            _require(tuple(s.shape) == want and s.dtype == torch.float32 and s.is_contiguous()
                     and s.device == k_cache.device,
                     lambda: f"scales.{name} must be contiguous float32 of shape {want} on the cache's device, "
                             f"got {s.dtype} {tuple(s.shape)}")
    _require(k_cache.is_contiguous() and v_cache.is_contiguous(), lambda: "k_cache and v_cache must be contiguous")
    block_size = k_cache.shape[1]
    _require(block_size >= 1 and block_size & (block_size - 1) == 0 and block_size <= 128,
             lambda: f"block_size {block_size} must be a power of two in [1, 128]")
    _require(k_cache.device == v_cache.device, lambda: "k_cache and v_cache must be on one device")


def check_decode_args(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    out: torch.Tensor | None = None,
    head_dims: tuple[int, ...] = SUPPORTED_HEAD_DIMS,
    scales=None,
    quantized: tuple[torch.dtype, ...] = (),
    window: int = 0,
) -> None:
    """Validate a decode-attention call (layout in kernels/reference.py)."""
    _require(isinstance(window, int) and not isinstance(window, bool),
             lambda: f"window must be an int (tokens; 0 or less: no window), got {window!r}")
    check_cache(k_cache, v_cache, scales, quantized)
    _require(q.dim() == 3, lambda: f"q must be [batch, heads, head_dim], got shape {tuple(q.shape)}")
    batch, heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    _require(head_dim == k_cache.shape[3], lambda: f"q head_dim {head_dim} != cache head_dim {k_cache.shape[3]}")
    _require(head_dim in head_dims, lambda: f"head_dim {head_dim} not supported; allowed: {head_dims}")
    _require(heads % kv_heads == 0, lambda: f"query heads {heads} not a multiple of kv_heads {kv_heads}")
    if scales is None:
        _require(q.dtype == k_cache.dtype, lambda: f"q is {q.dtype} but the cache is {k_cache.dtype}")
    else:
        _require(q.dtype in SUPPORTED_DTYPES, lambda: f"q is {q.dtype}; allowed: {SUPPORTED_DTYPES}")
    _require(q.stride(-1) == 1, lambda: "q's last dimension must be contiguous")
    _require(block_tables.dim() == 2 and block_tables.shape[0] == batch,
             lambda: f"block_tables must be [batch={batch}, max_blocks], got {tuple(block_tables.shape)}")
    _require(block_tables.dtype == torch.int32, lambda: f"block_tables must be int32, got {block_tables.dtype}")
    _require(block_tables.is_contiguous(), lambda: "block_tables must be contiguous")
    _require(context_lens.shape == (batch,),
             lambda: f"context_lens must be [batch={batch}], got {tuple(context_lens.shape)}")
    _require(context_lens.dtype == torch.int32, lambda: f"context_lens must be int32, got {context_lens.dtype}")
    for name, t in (("block_tables", block_tables), ("context_lens", context_lens)):
        _require(t.device == q.device, lambda: f"{name} is on {t.device} but q is on {q.device}")
    _require(k_cache.device == q.device, lambda: f"cache is on {k_cache.device} but q is on {q.device}")
    if out is not None:
        _require(out.shape == q.shape and out.dtype == q.dtype and out.device == q.device,
                 lambda: f"out must match q ({tuple(q.shape)}, {q.dtype}, {q.device})")
        _require(out.stride(-1) == 1, lambda: "out's last dimension must be contiguous")


def check_write_args(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    scales=None,
    quantized: tuple[torch.dtype, ...] = (),
) -> None:
    """Validate a KV-write call: rows ``[tokens, kv_heads, head_dim]`` into their slots."""
    check_cache(k_cache, v_cache, scales, quantized)
    _require(key.dim() == 3 and key.shape == value.shape,
             lambda: f"key/value must be [tokens, kv_heads, head_dim] and equal, "
                     f"got {tuple(key.shape)} / {tuple(value.shape)}")
    _require(key.shape[1:] == k_cache.shape[2:],
             lambda: f"key rows {tuple(key.shape[1:])} do not match cache rows {tuple(k_cache.shape[2:])}")
    if scales is None:
        _require(key.dtype == k_cache.dtype and value.dtype == k_cache.dtype,
                 lambda: f"key/value dtype {key.dtype}/{value.dtype} != cache dtype {k_cache.dtype}")
    else:
        _require(key.dtype in SUPPORTED_DTYPES and value.dtype == key.dtype,
                 lambda: f"key/value dtype {key.dtype}/{value.dtype}; allowed: {SUPPORTED_DTYPES}, both alike")
    _require(key.stride(-1) == 1 and value.stride(-1) == 1, lambda: "key/value last dimension must be contiguous")
    _require(slot_mapping.shape == (key.shape[0],),
             lambda: f"slot_mapping must be [tokens={key.shape[0]}], got {tuple(slot_mapping.shape)}")
    _require(slot_mapping.dtype == torch.int64, lambda: f"slot_mapping must be int64, got {slot_mapping.dtype}")
    for name, t in (("value", value), ("k_cache", k_cache), ("slot_mapping", slot_mapping)):
        _require(t.device == key.device, lambda: f"{name} is on {t.device} but key is on {key.device}")
