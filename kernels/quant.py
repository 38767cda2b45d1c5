"""Quantize and dequantize KV rows: the reference every quantizing kernel is tested against.

A quantized store holds one byte per element (``kernels/kv_formats.py``) and fp32 scales,
``x ~= stored * scale``. ``KVScales`` carries a layer's K and V scales to the kernels:

- per tensor (``kv_scale=tensor``): 0-dim fp32 tensors, static. The cache sets them once,
  from the amax of the first rows it writes into the layer (``calibrate``), on the device
  (no host sync); the writers read them.
- per token and head (``kv_scale=token_head``): ``[num_blocks, block_size, kv_heads]`` fp32,
  beside the values; the writers compute each row's scale (its amax / qmax) and store it.

A 0-dim scale broadcasts over any rows; a per-row one gains a trailing axis over head_dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvbench.kernels.kv_formats import KV_FORMATS, KVFormat

# A row of zeros (a fresh pool's, a padded token's) still gets a usable, finite scale.
MIN_SCALE = 1e-12


def kv_format(dtype: torch.dtype) -> KVFormat | None:
    """The quantized format a store of ``dtype`` holds; None for a plain (float) store."""
    for fmt in KV_FORMATS.values():
        if getattr(torch, fmt.torch_name) == dtype:
            return fmt
    return None


def storage_dtype(kv_dtype: str) -> torch.dtype:
    return getattr(torch, KV_FORMATS[kv_dtype].torch_name)


@dataclass(frozen=True)
class KVScales:
    """One layer's K and V scales; ``dynamic``: per token and head, written with the rows."""

    k: torch.Tensor
    v: torch.Tensor
    dynamic: bool

    @classmethod
    def allocate(cls, kv_scale: str, store_shape: tuple[int, ...], device: torch.device) -> "KVScales":
        """Scales for a store of ``store_shape`` ``[blocks, block_len, kv_heads, head_dim]``; ones until written."""
        dynamic = kv_scale == "token_head"
        shape = store_shape[:-1] if dynamic else ()
        return cls(torch.ones(shape, device=device), torch.ones(shape, device=device), dynamic)


def _broadcast(scale: torch.Tensor) -> torch.Tensor:
    return scale if scale.dim() == 0 else scale.unsqueeze(-1)


def row_scales(x: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """Each row's scale, ``x [..., head_dim]`` -> ``[...]`` fp32: its amax maps onto ``fmt.qmax``."""
    return (x.float().abs().amax(dim=-1) / fmt.qmax).clamp(min=MIN_SCALE)


def tensor_scale(x: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """One scale for all of ``x`` (0-dim fp32)."""
    return (x.float().abs().amax() / fmt.qmax).clamp(min=MIN_SCALE)


def quantize(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x / scale`` in the store's ``dtype``, saturating at the format's qmax.

    Clamped first: a float8_e4m3fn cast of a value past 448 is NaN (the format has no inf),
    and an int8 cast wraps. int8 rounds to nearest (ties to even).
    """
    fmt = kv_format(dtype)
    y = (x.float() / _broadcast(scale)).clamp(-fmt.qmax, fmt.qmax)
    return (y.round() if fmt.integer else y).to(dtype)


def dequantize(stored: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``stored * scale`` in ``dtype``; ``scale`` 0-dim or ``stored.shape[:-1]``."""
    return (stored.float() * _broadcast(scale)).to(dtype)


def quantize_rows(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype,
                  dynamic: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``x [tokens, kv_heads, head_dim]`` quantized, and their scales ``[tokens, kv_heads]``
    (dynamic) or the static ``scale`` itself."""
    fmt = kv_format(dtype)
    s = row_scales(x, fmt) if dynamic else scale
    return quantize(x, s, dtype), s


def calibrate(scales: KVScales, key: torch.Tensor, value: torch.Tensor, dtype: torch.dtype) -> None:
    """Set static per-tensor scales from the amax of ``key`` and ``value`` (in place, on the device)."""
    fmt = kv_format(dtype)
    scales.k.copy_(tensor_scale(key, fmt))
    scales.v.copy_(tensor_scale(value, fmt))


def write_quantized_ref(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        slot_mapping: torch.Tensor, scales: KVScales) -> None:
    """Quantize ``key``/``value`` rows into their slots (all >= 0) and, dynamic, their scales beside them."""
    for rows, cache, scale in ((key, k_cache, scales.k), (value, v_cache, scales.v)):
        stored, s = quantize_rows(rows, scale, cache.dtype, scales.dynamic)
        cache.view(-1, *cache.shape[2:])[slot_mapping] = stored
        if scales.dynamic:
            scale.view(-1, scale.shape[-1])[slot_mapping] = s
