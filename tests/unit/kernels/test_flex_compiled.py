"""The flex kernel's compiled path (kernels/flex.py: the pool itself, physical pages in the block mask; the GPU's
path) on CPU through inductor's C++ template, against the fp32 reference. One compile (~20 s): a slow test."""

from __future__ import annotations

import pytest
import torch

from kvbench.kernels.flex import flex_decode
from kvbench.kernels.reference import paged_decode_attention_ref
from tests.helpers.kernel_cases import assert_close_for_dtype, make_decode_inputs
from tests.unit.kernels.test_flex import LENS, loop_decode


def test_compiled_over_the_pool_matches_the_reference():
    pytest.importorskip("torch._inductor")
    q, k, v, tables, lens = make_decode_inputs(LENS, 2, 4, 32, 8, torch.float32, seed=7)
    for window in (0, 1, 5, 16, 200):  # one compile: the window is a tensor of the mask, not a shape
        got = flex_decode(q, k, v, tables, lens, 0.2, window=window, mode="compiled")
        want = paged_decode_attention_ref(q, k, v, tables, lens, 0.2, window=window)
        assert_close_for_dtype(got, want, torch.float32)
    # A batch of 3 runs padded to 4 (a power of two: the same compiled shapes); the padding rows are dropped.
    got = flex_decode(q[:3], k, v, tables[:3], lens[:3], 0.2, window=5, mode="compiled")
    torch.testing.assert_close(got, paged_decode_attention_ref(q, k, v, tables, lens, 0.2, window=5)[:3])
    # Inductor's CPU template returns no lse: with sinks the call runs eager, and is still right.
    sinks = torch.linspace(-1.0, 5.0, q.shape[1])
    got = flex_decode(q, k, v, tables, lens, 0.2, window=5, sinks=sinks, mode="compiled")
    assert_close_for_dtype(got, loop_decode(q, k, v, tables, lens, 0.2, 5, sinks), torch.float32)
