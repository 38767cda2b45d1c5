"""Prefill attention with a sliding window (kernels/prefill.py): whole prompts and chunks across the
window's edge, against a per-query loop over transformers' rule (key j visible to query p: p - window < j <= p)."""

from __future__ import annotations

import pytest
import torch

from kvbench.kernels.prefill import prefill_attention
from tests.helpers.window_cases import naive_window_attention


@pytest.mark.parametrize("window", [0, 1, 3, 8, 24, 100])
@pytest.mark.parametrize("cached,new", [(0, 1), (0, 30), (20, 1), (20, 9), (5, 30), (29, 40)])
def test_windowed_prefill_matches_the_rule(window, cached, new):
    gen = torch.Generator().manual_seed(cached * 100 + new)
    length = cached + new
    q = torch.randn(new, 4, 16, generator=gen)
    k, v = torch.randn(length, 2, 16, generator=gen), torch.randn(length, 2, 16, generator=gen)
    got = prefill_attention(q, k, v, 0.25, window)
    torch.testing.assert_close(got, naive_window_attention(q, k, v, 0.25, window), atol=1e-5, rtol=1e-5)


def test_chunks_across_the_window_edge_equal_one_prefill():
    """A prompt prefilled in chunks (each over its cached prefix) equals the prompt at once."""
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(50, 4, 16, generator=gen)
    k, v = torch.randn(50, 2, 16, generator=gen), torch.randn(50, 2, 16, generator=gen)
    whole = prefill_attention(q, k, v, 0.25, 12)
    parts = [prefill_attention(q[a:b], k[:b], v[:b], 0.25, 12) for a, b in ((0, 7), (7, 19), (19, 20), (20, 50))]
    torch.testing.assert_close(torch.cat(parts), whole, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(whole, prefill_attention(q, k, v, 0.25), atol=1e-3)
