"""The Triton decode kernel's attention sinks (its SINK variant) against the reference; tiny shapes, for the
interpreter on CPU. One split and forced split-K (the sink joins split 0 only), with and without a window,
float and quantized caches."""

from __future__ import annotations

import pytest
import torch

import kvbench.kernels.triton_mode  # noqa: F401  (turns on the Triton interpreter without CUDA; before the kernels)
from kvbench.kernels.triton_paged import paged_decode_attention_triton
from kvbench.kernels.validate import KernelArgumentError
from tests.helpers.kernel_cases import make_decode_inputs
from tests.helpers.sink_cases import SINK_LENS, check_sink_decode

CASES = [
    # window, dtype, block, group, num_splits
    (0, torch.float32, 1, 4, None),
    (0, torch.bfloat16, 8, 2, 3),
    (5, torch.float32, 8, 2, 3),
    (16, torch.float16, 16, 1, None),
    (17, torch.bfloat16, 4, 2, 2),
    (200, torch.float32, 16, 2, 3),
]


@pytest.mark.parametrize("window,dtype,block_size,group,num_splits", CASES, ids=str)
def test_decode_with_sinks_matches_reference(window, dtype, block_size, group, num_splits):
    check_sink_decode(paged_decode_attention_triton, SINK_LENS, window, 2, group, 64, block_size, dtype,
                      num_splits=num_splits)


@pytest.mark.parametrize("kv_dtype,kv_scale,window", [("fp8_e4m3", "tensor", 0), ("int8", "token_head", 5)])
def test_decode_with_sinks_on_a_quantized_cache(kv_dtype, kv_scale, window):
    check_sink_decode(paged_decode_attention_triton, SINK_LENS, window, 2, 2, 64, 8, torch.bfloat16,
                      kv_dtype=kv_dtype, kv_scale=kv_scale, num_splits=2)


@pytest.mark.parametrize("sinks", [torch.zeros(3), torch.zeros(4, dtype=torch.float16), torch.zeros(8)[::2]])
def test_bad_sinks_are_refused(sinks):
    q, k, v, tables, lens = make_decode_inputs([5], 2, 2, 64, 8, torch.float32)
    with pytest.raises(KernelArgumentError, match="sinks must be contiguous float32"):
        paged_decode_attention_triton(q, k, v, tables, lens, 0.1, sinks=sinks)
