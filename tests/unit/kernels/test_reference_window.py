"""The reference's sliding window (kernels/reference.py) against the rule stated by loops
(tests/helpers/window_cases.py), and transformers' own mask function."""

from __future__ import annotations

import pytest
import torch

from kvbench.kernels.reference import paged_decode_attention_ref
from tests.helpers.kernel_cases import make_decode_inputs
from tests.helpers.window_cases import WINDOW_LENS, WINDOWS, naive_window_decode


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("block_size,group", [(1, 1), (8, 4), (16, 2)])
def test_windowed_decode_matches_the_rule(window, block_size, group):
    q, k, v, tables, lens = make_decode_inputs(WINDOW_LENS, 2, group, 32, block_size, torch.float32, seed=window)
    got = paged_decode_attention_ref(q, k, v, tables, lens, 0.2, window=window)
    torch.testing.assert_close(got, naive_window_decode(q, k, v, tables, lens, 0.2, window), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("none", [0, -1])
def test_no_window_is_full_attention(none):
    q, k, v, tables, lens = make_decode_inputs(WINDOW_LENS, 2, 2, 32, 8, torch.float32)
    full = paged_decode_attention_ref(q, k, v, tables, lens, 0.2)
    assert torch.equal(paged_decode_attention_ref(q, k, v, tables, lens, 0.2, window=none), full)
    assert not torch.allclose(paged_decode_attention_ref(q, k, v, tables, lens, 0.2, window=5), full)


def test_the_rule_is_transformers_sliding_window():
    """transformers' mask: key j is visible to query i when j > i - window (and j <= i)."""
    from transformers.masking_utils import sliding_window_causal_mask_function

    window, length = 4, 9
    visible = sliding_window_causal_mask_function(window)
    q_pos = length - 1  # the decode query
    zero = torch.tensor(0)
    keys = [j for j in range(length) if visible(zero, zero, torch.tensor(q_pos), torch.tensor(j))]
    assert keys == list(range(length - window, length))  # what the reference keeps: j >= context_len - window
