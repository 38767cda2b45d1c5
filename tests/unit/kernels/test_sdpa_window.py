"""SDPA over a slab with a sliding window (kernels/sdpa.py ``slab_decode``) against the reference."""

from __future__ import annotations

import pytest
import torch

from kvbench.kernels.reference import paged_decode_attention_ref
from kvbench.kernels.sdpa import slab_decode
from tests.helpers.window_cases import WINDOW_LENS, WINDOWS


def _slab(lens, lanes, length=100, seed=0):
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(lanes, length, 2, 32, generator=gen)
    v = torch.randn(lanes, length, 2, 32, generator=gen)
    q = torch.randn(len(lens), 8, 32, generator=gen)
    return q, k, v


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("gathered", [False, True])
def test_windowed_slab_decode_matches_reference(window, gathered):
    lens = WINDOW_LENS
    q, k, v = _slab(lens, len(lens) + 2 if gathered else len(lens), seed=window)  # ungathered: lane b is b
    lanes = torch.tensor([[len(lens) + 1 - i] for i in range(len(lens))], dtype=torch.int32) if gathered else None
    tables = lanes if gathered else torch.arange(len(lens), dtype=torch.int32)[:, None]
    context = torch.tensor(lens, dtype=torch.int32)
    got = slab_decode(q, k, v, lanes, context, 0.2, max_context=max(lens), window=window)
    # the reference reads the slab as a pool of one block per lane
    want = paged_decode_attention_ref(q, k, v, tables, context, 0.2, window=window)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [1, 7, 64, 200])
def test_a_full_slab_is_cut_to_its_window(window):
    """No context_lens: every sequence holds max_context keys, and a window reads only its last ones."""
    q, k, v = _slab([0, 0], 2)
    got = slab_decode(q, k, v, None, None, 0.2, max_context=64, window=window)
    tables = torch.arange(2, dtype=torch.int32)[:, None]
    want = paged_decode_attention_ref(q, k, v, tables, torch.full((2,), 64, dtype=torch.int32), 0.2, window=window)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
