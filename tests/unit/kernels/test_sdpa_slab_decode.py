"""slab_decode with a block table (a gather of each sequence's lane) gives what the view of the
same lanes gives, and gathers only the tokens it reads."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kvbench.kernels.sdpa import slab_decode

LANES, L, KV_HEADS, HEADS, HEAD_DIM = 5, 37, 2, 6, 24  # awkward sizes: nothing a power of two
TABLE = [4, 0, 2]  # sequence b reads lane TABLE[b]
MAX_CONTEXT = 29


class IndexSelectShapes(TorchDispatchMode):
    """The shapes of the tensors index_select gathers from."""

    def __init__(self):
        super().__init__()
        self.shapes: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.index_select.default:
            self.shapes.append(tuple(args[0].shape))
        return func(*args, **(kwargs or {}))


def _inputs(seed: int):
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(LANES, L, KV_HEADS, HEAD_DIM, generator=gen)
    v = torch.randn(LANES, L, KV_HEADS, HEAD_DIM, generator=gen)
    q = torch.randn(len(TABLE), HEADS, HEAD_DIM, generator=gen)
    return q, k, v


def test_a_gathered_call_equals_the_view_of_the_same_lanes():
    q, k, v = _inputs(0)
    table = torch.tensor(TABLE, dtype=torch.int32)[:, None]
    lanes = table[:, 0].long()
    for context_lens in (torch.tensor([5, MAX_CONTEXT, 1], dtype=torch.int32), None):
        want = slab_decode(q, k[lanes], v[lanes], None, context_lens, 0.3, max_context=MAX_CONTEXT)
        out = torch.empty_like(q)
        got = slab_decode(q, k, v, table, context_lens, 0.3, out, max_context=MAX_CONTEXT)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
        assert got.data_ptr() == out.data_ptr()


def test_the_gather_copies_only_the_tokens_read():
    q, k, v = _inputs(1)
    table = torch.tensor(TABLE, dtype=torch.int32)[:, None]
    with IndexSelectShapes() as seen:
        slab_decode(q, k, v, table, torch.tensor([3, 7, MAX_CONTEXT]), 0.3, max_context=MAX_CONTEXT)
    assert seen.shapes == [(LANES, MAX_CONTEXT, KV_HEADS, HEAD_DIM)] * 2  # K and V, not the lanes' L tokens


def test_quantized_slab_matches_reference_over_the_same_lanes():
    """A quantized slab (per-token scales, gathered with their lanes) is dequantized before SDPA:
    the paged reference over the same lanes, as one block per sequence, gives the same output."""
    from kvbench.kernels.reference import paged_decode_attention_ref
    from tests.helpers.kv_quant_cases import KV_CASES, quantized_copy

    gen = torch.Generator().manual_seed(3)
    k = torch.randn(LANES, 32, KV_HEADS, HEAD_DIM, generator=gen)
    v = torch.randn(LANES, 32, KV_HEADS, HEAD_DIM, generator=gen)
    q = torch.randn(len(TABLE), HEADS, HEAD_DIM, generator=gen)
    table = torch.tensor(TABLE, dtype=torch.int32)[:, None]
    lens = torch.tensor([29, 1, 17], dtype=torch.int32)
    for kv_dtype, kv_scale in KV_CASES:
        kq, vq, scales = quantized_copy(k, v, kv_dtype, kv_scale)
        got = slab_decode(q, kq, vq, table, lens, 0.3, max_context=MAX_CONTEXT, scales=scales)
        want = paged_decode_attention_ref(q, kq, vq, table, lens, 0.3, scales=scales)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=f"{kv_dtype} {kv_scale}")
