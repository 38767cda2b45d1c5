"""kernels/triton_quant.py through the Triton kernels: quantized decode against the reference over
the same cache, and the quantizing write bit for bit, at every kv_dtype and scale granularity.

The interpreter is slow on CPU: a cover of the axes (block size, GQA ratio, head_dim) rotating
through the dtype cases, not their product.
"""

from __future__ import annotations

import pytest
import torch

import kvbench.kernels.triton_mode  # noqa: F401  (turns on the Triton interpreter without CUDA; before the kernels)
from kvbench.kernels.triton_paged import paged_decode_attention_triton, write_kv_triton
from tests.helpers.kernel_cases import MIXED_LENS
from tests.helpers.kv_quant_cases import KV_CASES, check_quantized_decode, check_quantized_write

# block, kv_heads, group, head_dim, q dtype, forced splits
SHAPES = [(1, 2, 4, 64, torch.float32, None), (8, 1, 8, 80, torch.bfloat16, 3),
          (16, 2, 1, 64, torch.float16, None), (32, 1, 4, 80, torch.float32, 3),
          (16, 3, 2, 64, torch.bfloat16, None), (8, 2, 4, 96, torch.float32, None)]


@pytest.mark.parametrize(("kv_dtype", "kv_scale", "shape"), [(*c, s) for c, s in zip(KV_CASES, SHAPES)])
def test_decode_matches_reference_on_quantized_cache(kv_dtype, kv_scale, shape):
    block, kv_heads, group, head_dim, q_dtype, splits = shape
    check_quantized_decode(paged_decode_attention_triton, MIXED_LENS, kv_heads, group, head_dim, block, q_dtype,
                           kv_dtype, kv_scale, num_splits=splits)


@pytest.mark.parametrize(("kv_dtype", "kv_scale"), KV_CASES)
@pytest.mark.parametrize(("tokens", "kv_heads", "head_dim", "block"), [(1, 2, 64, 16), (23, 3, 80, 8)])
def test_write_quantizes_bit_for_bit(kv_dtype, kv_scale, tokens, kv_heads, head_dim, block):
    check_quantized_write(write_kv_triton, tokens, kv_heads, head_dim, block, kv_dtype, kv_scale)
