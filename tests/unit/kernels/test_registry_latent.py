"""Every paged kernel at MLA's real latent width: DeepSeek's 512 + 64 = 576 values as one kv head whose V store is its
K store (harness/model/deepseek.py's absorbed formulation), 5 query heads, against the torch reference: the C++ CPU op,
the CUDA kernels run by their CPU emulator (kernels/cuda_emulated.py), Triton's interpreter (its tiles pad 576 to 1024)
and FlexAttention; fp8 through the quantized stores too."""

from __future__ import annotations

import pytest
import torch

from kvbench.kernels.quant import KVScales, calibrate
from kvbench.kernels.reference import paged_decode_attention_ref, write_kv_ref
from kvbench.kernels.registry import get_paged_kernel
from kvbench.kernels.validate import SUPPORTED_HEAD_DIMS

LATENT = 576
HEADS, BLOCK, BLOCKS = 5, 8, 12


def _pool(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, the latent pool, block tables, context lengths): three sequences over shuffled blocks."""
    gen = torch.Generator().manual_seed(0)
    pool = torch.randn(BLOCKS, BLOCK, 1, LATENT, generator=gen).to(dtype)
    q = (torch.randn(3, HEADS, LATENT, generator=gen) / 4).to(dtype)
    tables = torch.randperm(BLOCKS, generator=gen).view(3, 4).to(torch.int32).contiguous()
    return q, pool, tables, torch.tensor([30, 7, 19], dtype=torch.int32)


def test_576_is_a_supported_head_dim():
    assert LATENT in SUPPORTED_HEAD_DIMS


@pytest.mark.parametrize("kernel", ["cuda", "flex", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_latent_pool_decodes_as_the_reference(kernel, dtype):
    if kernel == "triton":
        pytest.importorskip("triton")
    q, pool, tables, lens = _pool(dtype)
    want = paged_decode_attention_ref(q, pool, pool, tables, lens, 0.07)
    got = get_paged_kernel(kernel).decode(q, pool, pool, tables, lens, 0.07, max_context=30)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cuda_kernels_emulated_at_576(dtype):
    """The CUDA source's HEAD_DIM=576 instantiation (8-head tiles for the group of 5), run by the emulator."""
    from kvbench.kernels import cuda_emulated

    q, pool, tables, lens = _pool(dtype)
    want = paged_decode_attention_ref(q, pool, pool, tables, lens, 0.07)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(cuda_emulated.decode(q, pool, pool, tables, lens, 0.07).float(), want.float(),
                               rtol=tol, atol=tol)


def test_an_fp8_latent_written_twice_into_one_store_reads_back_once():
    """K and V are one store and one scale: writing the same rows as K and as V leaves the bytes of one write, and
    the C++ op reads them as the reference does."""
    gen = torch.Generator().manual_seed(1)
    rows = torch.randn(10, 1, LATENT, generator=gen)
    store = torch.zeros(2, BLOCK, 1, LATENT, dtype=torch.float8_e4m3fn)
    scale = torch.ones(())
    scales = KVScales(scale, scale, False)
    calibrate(scales, rows, rows, store.dtype)
    slots = torch.arange(10, dtype=torch.int64)
    cuda = get_paged_kernel("cuda")
    cuda.write(rows, rows, store, store, slots, scales=scales)
    once = torch.zeros_like(store)
    write_kv_ref(rows, rows, once, torch.zeros_like(once), slots, scales=scales)
    assert torch.equal(store.view(torch.uint8), once.view(torch.uint8))
    q = torch.randn(1, HEADS, LATENT, generator=gen) / 4
    tables, lens = torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([10], dtype=torch.int32)
    want = paged_decode_attention_ref(q, store, store, tables, lens, 0.07, scales=scales)
    torch.testing.assert_close(cuda.decode(q, store, store, tables, lens, 0.07, scales=scales), want,
                               rtol=1e-5, atol=1e-5)
