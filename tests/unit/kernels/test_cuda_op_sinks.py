"""The op's C++ CPU kernel with attention sinks (``sinks=`` of torch.ops.kvbench.paged_decode_attention) against
the reference, with and without a window, over float and quantized caches; the CUDA kernel's sinks run through
the emulator (test_cuda_emulated_sinks.py)."""

from __future__ import annotations

import pytest
import torch

from kvbench.kernels import cuda_op
from kvbench.kernels.cuda_op import paged_decode_attention_cuda
from kvbench.kernels.validate import KernelArgumentError
from tests.helpers.kernel_cases import make_decode_inputs
from tests.helpers.kv_quant_cases import KV_CASES
from tests.helpers.sink_cases import SINK_LENS, SINK_WINDOWS, check_sink_decode, make_sinks


@pytest.fixture(scope="module")
def op():
    return cuda_op.load_op()


@pytest.mark.parametrize("window", SINK_WINDOWS)
@pytest.mark.parametrize("block_size,group", [(1, 4), (8, 1), (16, 8)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_decode_with_sinks_matches_reference(op, window, block_size, group, dtype):
    check_sink_decode(paged_decode_attention_cuda, SINK_LENS, window, 2, group, 64, block_size, dtype)


@pytest.mark.parametrize("kv_dtype,kv_scale", KV_CASES)
def test_decode_with_sinks_on_a_quantized_cache(op, kv_dtype, kv_scale):
    check_sink_decode(paged_decode_attention_cuda, SINK_LENS, 16, 2, 2, 64, 8, torch.bfloat16, kv_dtype=kv_dtype,
                      kv_scale=kv_scale)


def test_no_sinks_is_the_call_without_them(op):
    q, k, v, tables, lens = make_decode_inputs(SINK_LENS, 2, 2, 64, 8, torch.float32)
    plain = paged_decode_attention_cuda(q, k, v, tables, lens, 0.125)
    assert torch.equal(torch.ops.kvbench.paged_decode_attention(q, k, v, tables, lens, 0.125, sinks=None), plain)
    sunk = torch.ops.kvbench.paged_decode_attention(q, k, v, tables, lens, 0.125, sinks=make_sinks(4))
    assert not torch.allclose(sunk, plain, atol=1e-3)


def test_an_empty_context_with_a_sink_is_zeros(op):
    q, k, v, tables, lens = make_decode_inputs([3, 4], 2, 2, 64, 8, torch.float32)
    lens[0] = 0
    out = paged_decode_attention_cuda(q, k, v, tables, lens, 0.125, sinks=make_sinks(4))
    assert torch.equal(out[0], torch.zeros_like(out[0])) and out[1].abs().sum() > 0


@pytest.mark.parametrize("sinks,match", [
    (torch.zeros(3), "sinks must be contiguous float32 \\[num_heads=4\\]"),
    (torch.zeros(4, dtype=torch.bfloat16), "sinks must be contiguous float32"),
    ([0.0] * 4, "sinks must be a float32 tensor"),
])
def test_bad_sinks_are_refused(op, sinks, match):
    q, k, v, tables, lens = make_decode_inputs([5], 2, 2, 64, 8, torch.float32)
    with pytest.raises(KernelArgumentError, match=match):
        paged_decode_attention_cuda(q, k, v, tables, lens, 0.125, sinks=sinks)


def test_the_op_itself_refuses_bad_sinks(op):
    """Called through torch.ops directly (no Python checks), ops.cpp refuses them."""
    q, k, v, tables, lens = make_decode_inputs([5], 2, 2, 64, 8, torch.float32)
    with pytest.raises(RuntimeError, match="sinks must be contiguous float32 \\[heads=4\\]"):
        torch.ops.kvbench.paged_decode_attention(q, k, v, tables, lens, 0.125, sinks=torch.zeros(2))


def test_opcheck_with_sinks(op):
    """The schema's ``Tensor? sinks`` (and the fake kernels' signature) pass torch's op checks."""
    q, k, v, tables, lens = make_decode_inputs(SINK_LENS, 2, 2, 64, 8, torch.float32)
    sinks = make_sinks(4)
    torch.library.opcheck(torch.ops.kvbench.paged_decode_attention.default, (q, k, v, tables, lens, 0.125),
                          {"window": 5, "sinks": sinks})
    torch.library.opcheck(torch.ops.kvbench.paged_decode_attention_out.default,
                          (q, k, v, tables, lens, 0.125, torch.empty_like(q)), {"sinks": sinks})
