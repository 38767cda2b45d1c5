"""The CUDA decode kernel's attention sinks, run by the CPU emulator (kernels/cuda_emulated.py): one partition,
and several (the sink joins the first partition's softmax, and the merge weighs it once), with and without a
window, over float and quantized caches."""

from __future__ import annotations

import pytest
import torch

from kvbench.kernels import cuda_emulated
from tests.helpers.sink_cases import SINK_LENS, check_sink_decode


@pytest.fixture(scope="module")
def emulated():
    return cuda_emulated.load()


@pytest.mark.parametrize("window,dtype,block_size,group", [
    (0, torch.float32, 16, 4), (5, torch.bfloat16, 1, 8), (0, torch.float16, 8, 2), (200, torch.float32, 16, 1),
], ids=str)
def test_decode_with_sinks_matches_reference(emulated, window, dtype, block_size, group):
    check_sink_decode(cuda_emulated.decode, SINK_LENS, window, 2, group, 64, block_size, dtype)


@pytest.mark.parametrize("sms,window", [(1, 0), (40, 0), (40, 130)])
def test_sinks_across_partitions(emulated, monkeypatch, sms, window):
    """Partitions of 512 and 128 tokens (test_cuda_emulated.py), with and without a window spanning several."""
    monkeypatch.setenv("KVBENCH_EMULATED_SMS", str(sms))
    check_sink_decode(cuda_emulated.decode, [3, 300, 1100], window, 1, 4, 64, 16, torch.bfloat16, seed=sms)


@pytest.mark.parametrize("kv_dtype,kv_scale", [("fp8_e4m3", "tensor"), ("int8", "token_head")])
def test_decode_with_sinks_on_a_quantized_cache(emulated, kv_dtype, kv_scale):
    check_sink_decode(cuda_emulated.decode, SINK_LENS, 16, 2, 2, 64, 8, torch.bfloat16, kv_dtype=kv_dtype,
                      kv_scale=kv_scale)
