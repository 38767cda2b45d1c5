"""The Triton side of a quantized KV cache (kernels/quant.py is the torch reference).

fp8 stores are handed to Triton as uint8 views and bitcast in registers, so one code path
serves the compiled kernels and the CPU interpreter (which has no fp8 pointers).
"""

from __future__ import annotations

import torch
from kvbench.kernels import triton_mode  # noqa: F401  (the interpreter switch, before triton)
import triton
import triton.language as tl

from kvbench.kernels.quant import kv_format

# QUANT codes: the constexpr the kernels branch on.
_CODES = {"fp8_e4m3": 1, "fp8_e5m2": 2, "int8": 3}
# fp32 round-to-nearest-even to an integer for |x| < 2**22 (torch.round's ties), with no
# libdevice call: adding and subtracting 1.5 * 2**23 drops the fraction bits.
_RNE_MAGIC = 12582912.0


def quant_code(dtype: torch.dtype) -> int:
    """0 for a float store, else the format's code."""
    fmt = kv_format(dtype)
    return 0 if fmt is None else _CODES[fmt.name]


def qmax_of(code: int) -> float:
    from kvbench.kernels.kv_formats import KV_FORMATS

    return {c: KV_FORMATS[name].qmax for name, c in _CODES.items()}[code]


def storage_view(cache: torch.Tensor) -> torch.Tensor:
    """An fp8 store as uint8 (same bytes); any other store as it is."""
    return cache.view(torch.uint8) if cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else cache


@triton.jit
def dequantize_tile(x, QUANT: tl.constexpr):
    """Stored bytes (uint8 bits of fp8, or int8) -> fp32, before the scale."""
    if QUANT == 1:
        return x.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    elif QUANT == 2:
        return x.to(tl.float8e5, bitcast=True).to(tl.float32)
    else:
        return x.to(tl.float32)


@triton.jit
def _round_to_fp8_grid(y, MANTISSA: tl.constexpr, MIN_EXP: tl.constexpr):
    """``y`` rounded (to nearest, ties to even) onto the fp8 values, still in fp32.

    The cast that follows is then exact. Triton 3.9's interpreter rounds fp32 -> fp8 wrong
    when the mantissa carries into the exponent (127.9 -> 64, not 128); rounding here
    first gives torch's bits on every backend, for a few ALU ops. The spacing of the fp8
    values around ``y`` is 2**(exponent - MANTISSA), floored at the subnormals' spacing.
    """
    exp = ((y.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    exp = tl.maximum(exp, MIN_EXP) - MANTISSA
    ulp = ((exp + 127) << 23).to(tl.float32, bitcast=True)
    return ((y / ulp + 12582912.0) - 12582912.0) * ulp


@triton.jit
def quantize_tile(y, QUANT: tl.constexpr, QMAX: tl.constexpr):
    """fp32 values already divided by their scale -> stored bytes, saturating at QMAX."""
    y = tl.minimum(tl.maximum(y, -QMAX), QMAX)
    if QUANT == 1:  # e4m3: 3 mantissa bits, normals from 2**-6
        return _round_to_fp8_grid(y, 3, -6).to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    elif QUANT == 2:  # e5m2: 2 mantissa bits, normals from 2**-14
        return _round_to_fp8_grid(y, 2, -14).to(tl.float8e5).to(tl.uint8, bitcast=True)
    else:
        return ((y + 12582912.0) - 12582912.0).to(tl.int8)


__all__ = ["dequantize_tile", "quantize_tile", "quant_code", "qmax_of", "storage_view", "triton"]
