"""ContiguousCache with sliding-window layers: SDPA over the slab reads from the batch's first key still in any
window and masks the rest per sequence, in prefill (chunked across the window's edge) and decode."""

from __future__ import annotations

import pytest
import torch

from kvbench.impls.contiguous import ContiguousCache
from kvbench.impls.lane_allocator import LaneAllocator
from tests.helpers.window_cases import check_cache_windows


def _cache(layers: int = 3) -> ContiguousCache:
    return ContiguousCache(LaneAllocator(4, 64), num_layers=layers, num_heads=4, kv_heads=2, head_dim=16,
                           dtype=torch.float32, device=torch.device("cpu"), bytes_per_token=2 * layers * 2 * 16 * 4)


@pytest.mark.parametrize("prompts,chunk", [([30, 3, 12], 100), ([30, 3, 12], 7), ([25, 26], 5), ([1], 1)])
def test_windows_per_layer(prompts, chunk):
    check_cache_windows(_cache(), [0, 5, 17], prompts=prompts, steps=9, chunk=chunk)


def test_lanes_out_of_order_gather_and_mask():
    """Sequences admitted after a release sit in lanes out of batch order: the window's mask follows them."""
    cache = _cache(layers=2)
    cache.allocator.admit(9, cache.allocator.plan_admit([0] * 5, total_len=6))  # lane 0 taken, then freed
    cache.allocator.admit(8, cache.allocator.plan_admit([0] * 5, total_len=6))
    cache.allocator.release(9)
    check_cache_windows(cache, [3, 0], prompts=[14, 6], steps=4, chunk=8)
