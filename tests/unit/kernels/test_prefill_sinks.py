"""Prefill attention with attention sinks (kernels/prefill.py): whole prompts and chunks over a cached prefix,
with and without a window, against the rule by loops (a softmax over [scores, sink] per query)."""

from __future__ import annotations

import pytest
import torch

from kvbench.kernels.prefill import prefill_attention
from tests.helpers.kernel_cases import assert_close_for_dtype
from tests.helpers.sink_cases import make_sinks, naive_sink_attention


@pytest.mark.parametrize("window", [0, 1, 8, 100])
@pytest.mark.parametrize("cached,new", [(0, 1), (0, 30), (20, 1), (5, 30), (29, 40)])
@pytest.mark.parametrize("heads", [4, 2])
def test_prefill_with_sinks_matches_the_rule(window, cached, new, heads):
    gen = torch.Generator().manual_seed(cached * 100 + new)
    length = cached + new
    q = torch.randn(new, heads, 16, generator=gen)
    k, v = torch.randn(length, 2, 16, generator=gen), torch.randn(length, 2, 16, generator=gen)
    sinks = make_sinks(heads, seed=window)
    got = prefill_attention(q, k, v, 0.25, window, sinks)
    want = naive_sink_attention(q, k, v, 0.25, window, sinks)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got, naive_sink_attention(q, k, v, 0.25, window, None), atol=1e-3)


def test_bfloat16_prefill_with_sinks():
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(20, 4, 16, generator=gen).bfloat16()
    k, v = (torch.randn(33, 2, 16, generator=gen).bfloat16() for _ in range(2))
    sinks = make_sinks(4)
    got = prefill_attention(q, k, v, 0.25, 9, sinks)
    assert got.dtype == torch.bfloat16
    assert_close_for_dtype(got, naive_sink_attention(q, k, v, 0.25, 9, sinks), torch.bfloat16)


def test_chunks_with_sinks_equal_one_prefill():
    """A prompt prefilled in chunks (each over its cached prefix, across the window's edge) equals it at once."""
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(50, 4, 16, generator=gen)
    k, v = torch.randn(50, 2, 16, generator=gen), torch.randn(50, 2, 16, generator=gen)
    sinks = make_sinks(4)
    for window in (0, 12):
        whole = prefill_attention(q, k, v, 0.25, window, sinks)
        parts = [prefill_attention(q[a:b], k[:b], v[:b], 0.25, window, sinks)
                 for a, b in ((0, 7), (7, 19), (19, 20), (20, 50))]
        torch.testing.assert_close(torch.cat(parts), whole, atol=1e-5, rtol=1e-5)
