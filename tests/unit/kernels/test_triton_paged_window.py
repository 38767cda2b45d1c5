"""The Triton decode kernel's sliding window (its SLIDE variant) against the reference; tiny shapes,
for the interpreter on CPU. One split and forced split-K (a window's range cut across splits)."""

from __future__ import annotations

import pytest
import torch

import kvbench.kernels.triton_mode  # noqa: F401  (turns on the Triton interpreter without CUDA; before the kernels)
from kvbench.kernels.triton_paged import paged_decode_attention_triton
from tests.helpers.window_cases import WINDOW_LENS, check_window_decode

CASES = [
    # window, dtype, block, group, num_splits
    (1, torch.float32, 1, 4, None),
    (5, torch.float32, 8, 2, 3),
    (16, torch.float16, 16, 1, None),
    (17, torch.float32, 8, 4, None),
    (24, torch.bfloat16, 4, 2, 2),
    (200, torch.float32, 16, 2, 3),
]


@pytest.mark.parametrize("window,dtype,block_size,group,num_splits", CASES, ids=str)
def test_windowed_decode_matches_reference(window, dtype, block_size, group, num_splits):
    check_window_decode(paged_decode_attention_triton, WINDOW_LENS, window, 2, group, 64, block_size, dtype,
                        num_splits=num_splits)
