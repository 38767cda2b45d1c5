"""Quantizing-write cases for the CUDA op's write kernels (``kvbench::write_kv_quant``): the C++ CPU
kernel (test_cuda_op_quantized.py) and the .cu kernel on the CPU emulator (test_cuda_emulated_quantized.py),
each against the torch reference's quantizer (kernels/quant.py via ``write_kv_ref``).

The reference takes one correctly rounded fp32 step at a time (a true division, a max, a clamp, a
round-to-nearest-even cast), and so do the kernels (kernels/csrc/kv_quant.h): the bytes and scales
must be EQUAL, not close. ``check_write_quant`` measures what differs anyway, so a failure says how much.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvbench.kernels.kv_formats import KV_FORMATS
from kvbench.kernels.quant import KVScales, calibrate, storage_dtype
from kvbench.kernels.reference import write_kv_ref
from tests.helpers.kernel_cases import WriteKernel

KV_CASES = [(f, s) for f in KV_FORMATS for s in ("tensor", "token_head")]


@dataclass(frozen=True)
class WriteDiff:
    """How a kernel's quantized write differs from the reference's: all zero when it is exact."""

    bytes_differ: int  # cache bytes (K and V) not equal to the reference's
    max_value_diff: float  # largest |dequantized kernel - dequantized reference| over written rows
    max_scale_diff: float  # largest |scale difference| (per token and head: the stored ones)

    @property
    def exact(self) -> bool:
        return self.bytes_differ == 0 and self.max_value_diff == 0 and self.max_scale_diff == 0


def _random_bytes(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """A pool filled with arbitrary bytes (NaN patterns too): a slot the write must not touch keeps them."""
    return torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8).view(dtype)


def _copy(scales: KVScales, device: str) -> KVScales:
    return KVScales(scales.k.to(device, copy=True), scales.v.to(device, copy=True), scales.dynamic)


def compare_writes(kernel: WriteKernel, key: torch.Tensor, value: torch.Tensor, slots: torch.Tensor,
                   pool_shape: tuple[int, ...], kv_dtype: str, kv_scale: str, static_from: int | None = None,
                   seed: int = 0, device: str = "cpu") -> WriteDiff:
    """``kernel`` (on ``device``) and the reference (on CPU) write the same CPU rows into the same
    pre-filled pool and scales.

    The reference runs on CPU wherever the kernel runs: on CUDA, torch divides by a Python scalar as a
    multiply by its reciprocal (one rounding more), so quant.py's ``amax / qmax`` there may be 1 ulp off
    the true quotient that the CPU reference and the kernels compute.
    Static scales are calibrated (kernels/quant.py ``calibrate``) from the first ``static_from``
    tokens (all when None): later, larger rows then exceed them and must saturate alike.
    """
    dtype = storage_dtype(kv_dtype)
    gen = torch.Generator().manual_seed(seed)
    k0, v0 = _random_bytes(pool_shape, dtype, gen), _random_bytes(pool_shape, dtype, gen)
    scales0 = KVScales.allocate(kv_scale, pool_shape, torch.device("cpu"))
    if scales0.dynamic:  # untouched slots keep these; written ones get their rows' scales
        scales0.k.copy_(torch.rand(pool_shape[:3], generator=gen))
        scales0.v.copy_(torch.rand(pool_shape[:3], generator=gen))
    else:
        kept = slice(None, static_from)
        calibrate(scales0, key[kept], value[kept], dtype)
    k_ref, v_ref, s_ref = k0.clone(), v0.clone(), _copy(scales0, "cpu")
    _reference(key, value, k_ref, v_ref, slots, scales=s_ref)
    k_got, v_got, s_got = k0.to(device, copy=True), v0.to(device, copy=True), _copy(scales0, device)
    kernel(key.to(device), value.to(device), k_got, v_got, slots.to(device), scales=s_got)
    k_got, v_got, s_got = k_got.cpu(), v_got.cpu(), _copy(s_got, "cpu")
    bytes_differ = sum(int((a.view(torch.uint8) != b.view(torch.uint8)).sum()) for a, b in ((k_ref, k_got),
                                                                                         (v_ref, v_got)))
    written = slots[slots >= 0]
    max_value = 0.0
    for ref, got, sr, sg in ((k_ref, k_got, s_ref.k, s_got.k), (v_ref, v_got, s_ref.v, s_got.v)):
        rows_ref = ref.view(-1, *pool_shape[2:])[written].float()
        rows_got = got.view(-1, *pool_shape[2:])[written].float()
        if sr.dim():
            rows_ref = rows_ref * sr.view(-1, pool_shape[2])[written, :, None]
            rows_got = rows_got * sg.view(-1, pool_shape[2])[written, :, None]
        else:
            rows_ref, rows_got = rows_ref * sr, rows_got * sg
        diff = (rows_got - rows_ref).abs().nan_to_num(nan=float("inf"))
        diff[rows_got.isnan() & rows_ref.isnan()] = 0  # the same NaN byte
        max_value = max(max_value, float(diff.max()) if diff.numel() else 0.0)
    max_scale = max(float((s_got.k - s_ref.k).abs().max()), float((s_got.v - s_ref.v).abs().max()))
    return WriteDiff(bytes_differ, max_value, max_scale)


def _reference(key, value, k_cache, v_cache, slot_mapping, *, scales):
    write_kv_ref(key, value, k_cache, v_cache, slot_mapping, may_skip=True, scales=scales)


def check_write_quant(kernel: WriteKernel, tokens: int, kv_heads: int, head_dim: int, block_size: int,
                      key_dtype: torch.dtype, kv_dtype: str, kv_scale: str, seed: int = 0,
                      device: str = "cpu") -> WriteDiff:
    """Fresh random rows with awkward contents, written by ``kernel`` (on ``device``) and by the
    reference (on CPU): equal bytes and scales. Rows span six decades (per-row scales must follow each; the static scale, calibrated on
    the first half, saturates the second); token 0 is all zeros (the scale floor), token 2 tiny (fp8
    subnormals, and a dynamic scale floored while its row is not zero); every third token is padding
    (slot -1); key and value are strided views of one fused buffer, as a qkv projection's slices are.
    """
    gen = torch.Generator().manual_seed(seed)
    num_blocks = (2 * tokens + block_size - 1) // block_size + 3  # room to scatter the slots
    pool_shape = (num_blocks, block_size, kv_heads, head_dim)
    mags = torch.logspace(-3, 3, tokens)[:, None, None]
    fused = torch.randn(tokens, kv_heads, 2 * head_dim + 16, generator=gen) * mags
    fused[0] = 0
    if tokens > 2:
        fused[2] *= 1e-9 if key_dtype == torch.float32 else 1e-5  # still nonzero in float16 / bfloat16
    fused = fused.to(key_dtype)
    key, value = fused[..., :head_dim], fused[..., head_dim + 16:]
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]
    slots[1::3] = -1
    diff = compare_writes(kernel, key, value, slots, pool_shape, kv_dtype, kv_scale,
                          static_from=max(1, tokens // 2), seed=seed + 1, device=device)
    assert diff.exact, f"{kv_dtype}/{kv_scale}: the write differs from the reference: {diff}"
    return diff


def boundary_values(kv_dtype: str) -> torch.Tensor:
    """fp32 values at every rounding decision of the format, for a scale of 1: each representable value,
    each midpoint between neighbours (a tie, to even) and the floats either side of it, the smallest
    subnormal's half and its neighbours, values past qmax (saturation: never NaN, never inf) and +-inf;
    for fp8, NaN too (stored as torch stores it, S.1111111; an int8 cast of NaN has no defined value)."""
    fmt = KV_FORMATS[kv_dtype]
    if fmt.integer:
        grid = torch.arange(-fmt.qmax, fmt.qmax + 1)
    else:
        decoded = torch.arange(256, dtype=torch.uint8).view(storage_dtype(kv_dtype)).float()
        grid = decoded[decoded.isfinite() & (decoded.abs() <= fmt.qmax)].unique()  # sorted; -0 and 0 as one
    mids = (grid[1:] + grid[:-1]) / 2  # exact: one more bit than the format has
    up, down = torch.full_like(mids, float("inf")), torch.full_like(mids, -float("inf"))
    beyond = torch.tensor([fmt.qmax + 0.5, fmt.qmax * 1.04, fmt.qmax * 1.1, 1e30, float("inf")])
    tiny = torch.tensor([-0.0, 1e-40, 1e-30])  # an fp32 subnormal; far below any fp8 subnormal
    values = [grid, mids, mids.nextafter(up), mids.nextafter(down), beyond, -beyond, tiny, -tiny]
    if not fmt.integer:  # half the smallest subnormal: a tie between 0 and it
        least = grid[grid > 0].min()
        half = torch.stack([least / 2, (least / 2).nextafter(torch.tensor(1.0)),
                            (least / 2).nextafter(torch.tensor(0.0))])
        values += [half, -half, torch.tensor([float("nan"), -float("nan")])]
    return torch.cat(values)


def check_write_boundaries(kernel: WriteKernel, kv_dtype: str, kv_heads: int = 2, head_dim: int = 64) -> WriteDiff:
    """Every rounding decision of ``kv_dtype`` (``boundary_values``) through ``kernel`` at a static scale
    of 1 (x / 1 is exact, so the encoder alone decides), equal to the reference's bytes."""
    values = boundary_values(kv_dtype)
    row = kv_heads * head_dim
    tokens = (values.numel() + row - 1) // row
    flat = torch.zeros(tokens * row)
    flat[:values.numel()] = values
    key = flat.view(tokens, kv_heads, head_dim)
    value = -key  # the other sign through V
    pool_shape = (tokens, 1, kv_heads, head_dim)
    dtype = storage_dtype(kv_dtype)
    k, v = torch.zeros(pool_shape, dtype=dtype), torch.zeros(pool_shape, dtype=dtype)
    ones = KVScales(torch.tensor(1.0), torch.tensor(1.0), False)
    slots = torch.arange(tokens)
    want_k, want_v = k.clone(), v.clone()
    _reference(key, value, want_k, want_v, slots, scales=ones)
    kernel(key, value, k, v, slots, scales=ones)
    bytes_differ = int((k.view(torch.uint8) != want_k.view(torch.uint8)).sum()
                       + (v.view(torch.uint8) != want_v.view(torch.uint8)).sum())
    wrong = (k.view(torch.uint8) != want_k.view(torch.uint8)).flatten()
    assert bytes_differ == 0, (f"{kv_dtype}: {bytes_differ} bytes differ, e.g. at inputs "
                               f"{flat[wrong][:8].tolist()}")
    return WriteDiff(0, 0.0, 0.0)
