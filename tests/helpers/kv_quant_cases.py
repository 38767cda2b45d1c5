"""Quantized-cache cases shared by the kernel suites: a kernel against the reference over the
same quantized cache (kernels/quant.py), and a write kernel against the reference's bytes."""

from __future__ import annotations

import torch

from kvbench.kernels.quant import KVScales, calibrate, storage_dtype, write_quantized_ref
from kvbench.kernels.reference import paged_decode_attention_ref, write_kv_ref
from tests.helpers.kernel_cases import TOLERANCE, DecodeKernel, WriteKernel, make_decode_inputs

KV_CASES = [(f, s) for f in ("fp8_e4m3", "fp8_e5m2", "int8") for s in ("tensor", "token_head")]


def quantized_copy(k: torch.Tensor, v: torch.Tensor, kv_dtype: str,
                   kv_scale: str) -> tuple[torch.Tensor, torch.Tensor, KVScales]:
    """``k``/``v`` pools quantized slot by slot by the reference writer (static scales from their amax)."""
    dtype = storage_dtype(kv_dtype)
    scales = KVScales.allocate(kv_scale, tuple(k.shape), k.device)
    if not scales.dynamic:
        calibrate(scales, k, v, dtype)
    kq, vq = torch.zeros(k.shape, dtype=dtype, device=k.device), torch.zeros(v.shape, dtype=dtype, device=k.device)
    slots = torch.arange(k.shape[0] * k.shape[1], device=k.device)
    write_quantized_ref(k.flatten(0, 1).float(), v.flatten(0, 1).float(), kq, vq, slots, scales)
    return kq, vq, scales


def check_quantized_decode(kernel: DecodeKernel, lens, kv_heads, group, head_dim, block_size, q_dtype,
                           kv_dtype: str, kv_scale: str, seed=0, **kernel_options) -> float:
    """``kernel`` over a quantized cache within q's dtype tolerance of the fp32 reference over the same
    cache; returns the largest absolute difference."""
    q, k, v, tables, lens_t = make_decode_inputs(lens, kv_heads, group, head_dim, block_size, torch.float32,
                                                 seed=seed)
    kq, vq, scales = quantized_copy(k, v, kv_dtype, kv_scale)
    scale = head_dim**-0.5
    q = q.to(q_dtype)
    out = torch.full_like(q, float("nan"))
    got = kernel(q, kq, vq, tables, lens_t, scale, out=out, scales=scales, **kernel_options)
    assert not torch.isnan(got).any(), "output rows left unwritten"
    want = paged_decode_attention_ref(q.float(), kq, vq, tables, lens_t, scale, scales=scales)
    atol, rtol = TOLERANCE[q_dtype]
    torch.testing.assert_close(got.float(), want, atol=atol, rtol=rtol)
    return (got.float() - want).abs().max().item()


def check_quantized_write(kernel: WriteKernel, tokens, kv_heads, head_dim, block_size, kv_dtype: str,
                          kv_scale: str, seed=0) -> None:
    """``kernel`` stores the reference's exact bytes and scales; every third token is padding (slot -1)."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = (2 * tokens + block_size - 1) // block_size + 3
    shape = (num_blocks, block_size, kv_heads, head_dim)
    fused = torch.randn(tokens, kv_heads, 2 * head_dim, generator=gen) * torch.logspace(-2, 2, tokens)[:, None, None]
    key, value = fused[..., :head_dim], fused[..., head_dim:]  # strided views, as a fused projection's
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]
    slots[1::3] = -1
    results = []
    def reference(key, value, kq, vq, slots, scales):
        write_kv_ref(key, value, kq, vq, slots, may_skip=True, scales=scales)

    for write in (reference, kernel):
        kq, vq, scales = quantized_copy(torch.randn(shape, generator=torch.Generator().manual_seed(seed + 1)),
                                        torch.randn(shape, generator=torch.Generator().manual_seed(seed + 2)),
                                        kv_dtype, kv_scale)
        write(key, value, kq, vq, slots, scales=scales)
        results.append((kq, vq, scales))
    (k0, v0, s0), (k1, v1, s1) = results
    bits = (lambda t: t.view(torch.uint8)) if k0.element_size() == 1 else (lambda t: t)
    assert torch.equal(bits(k0), bits(k1)) and torch.equal(bits(v0), bits(v1))
    assert torch.equal(s0.k, s1.k) and torch.equal(s0.v, s1.v)
