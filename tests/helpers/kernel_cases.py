"""Kernel cases shared by the Triton and the C++/CUDA kernel tests.

Both suites check a paged kernel the same way: fresh random inputs with awkward
sizes, the pure-torch reference in fp32 on the same (possibly half) inputs, and
one tolerance per dtype. A kernel is passed in as a function with the reference
signature (kernels/reference.py), so neither suite keeps a copy of this.
"""

from __future__ import annotations

from typing import Callable

import torch

from kvbench.kernels.reference import paged_decode_attention_ref, write_kv_ref

# Unaligned context lengths: a single token, ragged last blocks, several blocks.
MIXED_LENS = [1, 17, 54, 97, 300]

# (atol, rtol) of a kernel's output against the fp32 reference. The inputs are the
# same, so the error is the kernel's rounding: of its output, and, where P @ V runs
# at cache precision, of the probabilities; both scale with the dtype's precision
# and with |V| (~4 at most for randn caches). The values are the loosest each
# suite used before they were shared, which the GPU runs passed; on CPU the
# largest errors seen are about 6e-7, 6e-4 and 8e-3.
TOLERANCE: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (2e-2, 1e-2),
}

# (q, k_cache, v_cache, block_tables, context_lens, scale, out=None, **kernel options) -> out
DecodeKernel = Callable[..., torch.Tensor]
# (key, value, k_cache, v_cache, slot_mapping) -> None
WriteKernel = Callable[..., None]


def assert_close_for_dtype(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    """``got`` (in ``dtype``) within that dtype's tolerance of the fp32 reference ``want``."""
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=rtol)


def make_decode_inputs(lens, kv_heads, group, head_dim, block_size, dtype, device="cpu", seed=0, spare_blocks=7):
    """Random q and cache for ``lens``; each sequence's blocks are shuffled across a pool with unused blocks.

    Returns ``(q, k_cache, v_cache, block_tables, context_lens)`` on ``device``,
    drawn there (large GPU cases stay fast).
    """
    gen = torch.Generator(device).manual_seed(seed)
    blocks_per_seq = [(n + block_size - 1) // block_size for n in lens]
    pool = sum(blocks_per_seq) + spare_blocks
    physical = torch.randperm(pool, generator=gen, device=device).to(torch.int32)
    # Entries past a sequence's last block must be ignored: fill them with junk ids,
    # far outside the pool, so a kernel that reads one fails loudly.
    width = max(blocks_per_seq) + 2
    tables = torch.randint(-(10**6), 10**6, (len(lens), width), generator=gen, device=device, dtype=torch.int32)
    used = 0
    for row, n in enumerate(blocks_per_seq):
        tables[row, :n] = physical[used:used + n]
        used += n
    shape = (pool, block_size, kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen, device=device).to(dtype)
    v_cache = torch.randn(shape, generator=gen, device=device).to(dtype)
    q = torch.randn(len(lens), kv_heads * group, head_dim, generator=gen, device=device).to(dtype)
    lens_t = torch.tensor(lens, dtype=torch.int32, device=device)
    return q, k_cache, v_cache, tables, lens_t


def reference_decode(q, k_cache, v_cache, block_tables, context_lens, scale) -> torch.Tensor:
    """The reference on the same (possibly half) inputs, computed in fp32."""
    return paged_decode_attention_ref(q.float(), k_cache.float(), v_cache.float(), block_tables, context_lens, scale)


def check_decode(kernel: DecodeKernel, lens, kv_heads, group, head_dim, block_size, dtype, device="cpu", seed=0,
                 **kernel_options) -> None:
    """``kernel`` fills a NaN-filled ``out`` with the reference's result, within the dtype's tolerance."""
    q, k_cache, v_cache, tables, lens_t = make_decode_inputs(
        lens, kv_heads, group, head_dim, block_size, dtype, device, seed)
    scale = head_dim**-0.5
    out = torch.full_like(q, float("nan"))
    got = kernel(q, k_cache, v_cache, tables, lens_t, scale, out=out, **kernel_options)
    assert got is out
    assert not torch.isnan(out).any(), "output rows left unwritten"
    assert_close_for_dtype(out, reference_decode(q, k_cache, v_cache, tables, lens_t, scale), dtype)


def check_write(kernel: WriteKernel, tokens, kv_heads, head_dim, block_size, dtype, device="cpu",
                misaligned=False, seed=0) -> None:
    """``kernel`` stores exactly what the reference stores; every third token is padding (slot -1).

    key and value are strided views of one buffer, between tokens and between heads,
    as slices of a fused projection are; ``misaligned`` shifts them one element off
    16-byte alignment (the CUDA kernel's scalar path).
    """
    gen = torch.Generator(device).manual_seed(seed)
    num_blocks = (2 * tokens + block_size - 1) // block_size + 3  # room to scatter the slots
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen, device=device).to(dtype)
    v_cache = torch.randn(shape, generator=gen, device=device).to(dtype)
    start = int(misaligned)
    fused = torch.randn(tokens, kv_heads, start + 2 * head_dim, generator=gen, device=device).to(dtype)
    key = fused[..., start:start + head_dim]
    value = fused[..., start + head_dim:]
    slots = torch.randperm(num_blocks * block_size, generator=gen, device=device)[:tokens]
    slots[1::3] = -1
    want_k, want_v = k_cache.clone(), v_cache.clone()
    write_kv_ref(key, value, want_k, want_v, slots)
    kernel(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)
