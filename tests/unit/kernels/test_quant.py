"""kernels/quant.py: the quantize/dequantize round trip within each format's bound, saturation,
and the reference over a quantized cache equal to the reference over its dequantized values."""

from __future__ import annotations

import pytest
import torch

from kvbench.kernels.kv_formats import KV_FORMATS
from kvbench.kernels.quant import (KVScales, calibrate, dequantize, kv_format, quantize, quantize_rows, row_scales,
                           storage_dtype, tensor_scale, write_quantized_ref)
from kvbench.kernels.reference import gather_kv, paged_decode_attention_ref, write_kv_ref
from tests.helpers.kernel_cases import make_decode_inputs

FORMATS = tuple(KV_FORMATS)
# Half the spacing of the format's values, relative to |x| for normals, and in units of the scale
# below the smallest normal (subnormal spacing / 2): the round trip's worst error, round to nearest.
BOUNDS = {"fp8_e4m3": (2.0**-4, 2.0**-10), "fp8_e5m2": (2.0**-3, 2.0**-17), "int8": (0.0, 0.5)}


def _rows(seed: int, tokens: int = 37, heads: int = 3, dim: int = 80) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    # Rows of very different magnitudes: per-row scales must follow each.
    mags = torch.logspace(-3, 3, tokens)[:, None, None]
    return torch.randn(tokens, heads, dim, generator=gen) * mags


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dynamic", [False, True])
def test_round_trip_within_half_a_step(fmt, dynamic):
    x = _rows(1)
    dtype = storage_dtype(fmt)
    scale = row_scales(x, kv_format(dtype)) if dynamic else tensor_scale(x, kv_format(dtype))
    stored, s = quantize_rows(x, scale, dtype, dynamic)
    assert stored.dtype == dtype and torch.equal(s, scale)
    back = dequantize(stored, s)
    rel, abs_units = BOUNDS[fmt]
    s_b = s if s.dim() == 0 else s[..., None]
    bound = rel * x.abs() + abs_units * s_b + 1e-30
    assert torch.all((back - x).abs() <= bound * (1 + 1e-6))
    assert torch.isfinite(back).all()


@pytest.mark.parametrize("fmt", FORMATS)
def test_values_past_the_static_scale_saturate_not_nan(fmt):
    dtype = storage_dtype(fmt)
    first = torch.randn(5, 2, 64)
    scale = tensor_scale(first, kv_format(dtype))
    later = first * 10  # a later token beyond the calibrated amax
    back = dequantize(quantize(later, scale, dtype), scale)
    top = KV_FORMATS[fmt].qmax * scale
    assert torch.isfinite(back).all() and back.abs().max() <= top * (1 + 1e-6)
    assert back.abs().max() == pytest.approx(float(top), rel=1e-6)


@pytest.mark.parametrize("fmt", FORMATS)
def test_zero_rows_get_finite_scales(fmt):
    dtype = storage_dtype(fmt)
    x = torch.zeros(3, 2, 64)
    stored, s = quantize_rows(x, torch.tensor(1.0), dtype, dynamic=True)
    assert torch.isfinite(s).all() and (s > 0).all()
    assert torch.equal(dequantize(stored, s), x)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("block_size", [1, 8, 16])
def test_reference_over_quantized_cache_is_reference_over_its_values(fmt, dynamic, block_size):
    lens = [1, 17, 54]
    q, k, v, tables, lens_t = make_decode_inputs(lens, 2, 4, 64, block_size, torch.float32, seed=block_size)
    dtype = storage_dtype(fmt)
    scales = KVScales.allocate("token_head" if dynamic else "tensor", tuple(k.shape), torch.device("cpu"))
    kq, vq = torch.zeros(k.shape, dtype=dtype), torch.zeros(v.shape, dtype=dtype)
    if not dynamic:
        calibrate(scales, k, v, dtype)
    slots = torch.arange(k.shape[0] * block_size)
    write_quantized_ref(k.flatten(0, 1), v.flatten(0, 1), kq, vq, slots, scales)
    k_deq = dequantize(kq, scales.k)
    v_deq = dequantize(vq, scales.v)
    scale = 64**-0.5
    got = paged_decode_attention_ref(q, kq, vq, tables, lens_t, scale, scales=scales)
    want = paged_decode_attention_ref(q, k_deq, v_deq, tables, lens_t, scale)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    # The prefill gather dequantizes the same rows.
    row = gather_kv(kq, tables[1].long(), lens[1], scales.k, torch.float32)
    torch.testing.assert_close(row, gather_kv(k_deq, tables[1].long(), lens[1]))


@pytest.mark.parametrize("dynamic", [False, True])
def test_reference_write_skips_negative_slots(dynamic):
    dtype = storage_dtype("fp8_e4m3")
    shape = (4, 8, 2, 64)
    k, v = torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)
    scales = KVScales.allocate("token_head" if dynamic else "tensor", shape, torch.device("cpu"))
    rows = torch.randn(5, 2, 64)
    slots = torch.tensor([3, -1, 9, -1, 30])
    write_kv_ref(rows, rows, k, v, slots, may_skip=True, scales=scales)
    flat = k.view(-1, 2, 64).float()
    assert torch.count_nonzero(flat.abs().sum((1, 2))) == 3
    assert flat[[3, 9, 30]].abs().sum((1, 2)).gt(0).all()
