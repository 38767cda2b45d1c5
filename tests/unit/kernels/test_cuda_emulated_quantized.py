"""The CUDA kernels' quantized path (paged_attention.cu over an fp8 / int8 cache, decoded in
registers), run on the CPU emulator (kernels/cuda_emulated.py) against the torch reference over
the same cache, at every kv_dtype and scale granularity; and every byte's decode. The quantizing
write kernel (write_kv_quant_kernel: a warp per kv head for per-token scales) stores the reference
quantizer's exact bytes and scales, at every kv_dtype and scale granularity and every rounding boundary.

The emulator is slow (a block's threads are OS threads): a cover of the axes (block size, GQA
group below and above a block's 8 heads, head dim, one partition and split-K), rotating
through the dtype cases, not their product.
"""

from __future__ import annotations

import pytest
import torch

from kvbench.kernels import cuda_emulated
from tests.helpers.byte_decode_cases import BYTE_DTYPES, check_every_byte
from tests.helpers.kernel_cases import MIXED_LENS
from tests.helpers.kv_quant_cases import KV_CASES, check_quantized_decode, check_quantized_write
from tests.helpers.write_quant_cases import check_write_boundaries, check_write_quant

SPLIT_LENS = [1, 511, 513, 1100]  # split-K with a ragged end, on an emulated H200's 132 SMs

# block, kv_heads, group, head_dim, q dtype, lens
SHAPES = [(16, 2, 4, 64, torch.float32, MIXED_LENS), (8, 1, 12, 80, torch.bfloat16, [3, 130]),
          (1, 1, 2, 128, torch.float16, [5, 40]), (32, 2, 1, 96, torch.float32, SPLIT_LENS),
          (128, 1, 8, 256, torch.bfloat16, [9, 300]), (4, 3, 2, 64, torch.float16, [2, 17, 97])]


@pytest.fixture(scope="module")
def emulated():
    return cuda_emulated.load()


@pytest.mark.parametrize(("kv_dtype", "kv_scale", "shape"), [(*c, s) for c, s in zip(KV_CASES, SHAPES)], ids=str)
def test_decode_matches_reference_on_quantized_cache(emulated, kv_dtype, kv_scale, shape):
    block, kv_heads, group, head_dim, q_dtype, lens = shape
    check_quantized_decode(cuda_emulated.decode, lens, kv_heads, group, head_dim, block, q_dtype, kv_dtype, kv_scale)


@pytest.mark.parametrize(("kv_dtype", "kv_scale"), KV_CASES[::-1][:3])
def test_split_k_on_quantized_cache(emulated, monkeypatch, kv_dtype, kv_scale):
    """Few SMs: the launcher's partitions shrink to 128 tokens, so every scale crosses partitions."""
    monkeypatch.setenv("KVBENCH_EMULATED_SMS", "1")
    check_quantized_decode(cuda_emulated.decode, [3, 300], 1, 4, 64, 16, torch.bfloat16, kv_dtype, kv_scale, seed=2)


@pytest.mark.parametrize("dynamic", [False, True], ids=["tensor", "token_head"])
@pytest.mark.parametrize("dtype", BYTE_DTYPES, ids=str)
def test_every_byte_decodes_as_torch_casts_it(emulated, dtype, dynamic):
    check_every_byte(cuda_emulated.decode, dtype, dynamic)


@pytest.mark.parametrize(("kv_dtype", "kv_scale"), KV_CASES[:2])
def test_write_quantizes_bit_for_bit(emulated, kv_dtype, kv_scale):
    check_quantized_write(cuda_emulated.write, 23, 3, 80, 8, kv_dtype, kv_scale)


# tokens, kv_heads, head_dim, block_size, key/value dtype: odd token counts; head dims 64 / 80 / 128 (80: lanes
# of a warp take 2 or 3 values each); 8 kv heads: each of the block's 4 warps takes two (per-token scales).
EMULATED_WRITE_SHAPES = [(23, 3, 80, 8, torch.float32), (9, 8, 128, 1, torch.bfloat16),
                         (6, 2, 64, 128, torch.float16)]


@pytest.mark.parametrize("shape", EMULATED_WRITE_SHAPES, ids=str)
@pytest.mark.parametrize(("kv_dtype", "kv_scale"), KV_CASES)
def test_quantizing_write_matches_reference(emulated, kv_dtype, kv_scale, shape):
    check_write_quant(cuda_emulated.write, *shape, kv_dtype, kv_scale)


@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp8_e5m2", "int8"])
def test_quantizing_write_rounds_every_boundary_as_torch(emulated, kv_dtype):
    check_write_boundaries(cuda_emulated.write, kv_dtype)
