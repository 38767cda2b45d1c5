"""The CUDA decode kernel's sliding window, run by the CPU emulator (kernels/cuda_emulated.py): partitions
that start at the window's first block, a first partition partly before the window, and the merge of the
live partitions only."""

from __future__ import annotations

import pytest
import torch

from kvbench.kernels import cuda_emulated
from tests.helpers.window_cases import WINDOW_LENS, check_window_decode


@pytest.fixture(scope="module")
def emulated():
    return cuda_emulated.load()


@pytest.mark.parametrize("window,dtype,block_size,group", [
    (1, torch.float32, 16, 4), (5, torch.bfloat16, 1, 8), (17, torch.float32, 8, 2), (200, torch.float16, 16, 1),
], ids=str)
def test_windowed_decode_matches_reference(emulated, window, dtype, block_size, group):
    check_window_decode(cuda_emulated.decode, WINDOW_LENS, window, 2, group, 64, block_size, dtype)


@pytest.mark.parametrize("sms,window", [(1, 300), (3, 257), (40, 130), (40, 1000)])
def test_windows_across_partitions(emulated, monkeypatch, sms, window):
    """Partitions of 512, 256, 128 tokens (test_cuda_emulated.py) with windows spanning several of them."""
    monkeypatch.setenv("KVBENCH_EMULATED_SMS", str(sms))
    check_window_decode(cuda_emulated.decode, [3, 300, 1100], window, 1, 4, 64, 16, torch.bfloat16, seed=sms)
