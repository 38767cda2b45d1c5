"""The op's C++ CPU kernel with a sliding window (``window=`` of torch.ops.kvbench.paged_decode_attention)
against the reference; the CUDA kernel's window runs through the emulator (test_cuda_emulated_window.py),
and nvcc checks its source in test_cuda_op.py."""

from __future__ import annotations

import pytest
import torch

from kvbench.kernels import cuda_op
from kvbench.kernels.cuda_op import paged_decode_attention_cuda
from kvbench.kernels.quant import KVScales
from kvbench.kernels.reference import paged_decode_attention_ref
from tests.helpers.kernel_cases import make_decode_inputs
from tests.helpers.window_cases import WINDOW_LENS, WINDOWS, check_window_decode


@pytest.fixture(scope="module")
def op():
    return cuda_op.load_op()


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("block_size,group", [(1, 4), (8, 1), (16, 8)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_windowed_decode_matches_reference(op, window, block_size, group, dtype):
    check_window_decode(paged_decode_attention_cuda, WINDOW_LENS, window, 2, group, 64, block_size, dtype)


def test_window_zero_is_the_full_attention_call(op):
    q, k, v, tables, lens = make_decode_inputs(WINDOW_LENS, 2, 2, 64, 8, torch.float32)
    full = paged_decode_attention_cuda(q, k, v, tables, lens, 0.125)
    assert torch.equal(torch.ops.kvbench.paged_decode_attention(q, k, v, tables, lens, 0.125, window=0), full)
    assert torch.equal(torch.ops.kvbench.paged_decode_attention(q, k, v, tables, lens, 0.125, window=-1), full)


def test_blocks_before_the_window_are_not_read(op):
    """A table entry before the window's first block may be anything (a hybrid group frees such blocks)."""
    q, k, v, tables, lens = make_decode_inputs([40, 33], 2, 2, 64, 8, torch.float32)
    want = paged_decode_attention_ref(q, k, v, tables, lens, 0.125, window=10)
    tables[:, :2] = -(10**6)  # blocks 0-1 hold tokens 0-15, all before either window (30 .. 39, 23 .. 32)
    torch.testing.assert_close(paged_decode_attention_cuda(q, k, v, tables, lens, 0.125, window=10), want,
                               atol=1e-5, rtol=1e-5)


def test_windowed_quantized_cache(op):
    q, k, v, tables, lens = make_decode_inputs(WINDOW_LENS, 2, 2, 64, 8, torch.float32)
    scales = KVScales(torch.full(k.shape[:3], 0.05), torch.full(k.shape[:3], 0.05), True)
    kq, vq = (c.mul(20).round().clamp(-127, 127).to(torch.int8) for c in (k, v))
    got = paged_decode_attention_cuda(q, kq, vq, tables, lens, 0.125, scales=scales, window=5)
    want = paged_decode_attention_ref(q, kq, vq, tables, lens, 0.125, scales=scales, window=5)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("window", [2.5, True, "8", None])
def test_a_window_that_is_not_an_int_is_refused(window):
    from kvbench.kernels.validate import KernelArgumentError

    q, k, v, tables, lens = make_decode_inputs([3], 1, 1, 64, 8, torch.float32)
    with pytest.raises(KernelArgumentError, match="window must be an int"):
        paged_decode_attention_cuda(q, k, v, tables, lens, 0.125, window=window)
