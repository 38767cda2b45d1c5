"""ContiguousCache with attention sinks on some layers: SDPA over the slab with the sink as a zero key column,
in prefill (whole and chunked across a window's edge) and decode, beside layers without sinks."""

from __future__ import annotations

import pytest
import torch

from kvbench.impls.contiguous import ContiguousCache
from kvbench.impls.lane_allocator import LaneAllocator
from tests.helpers.sink_cases import check_cache_sinks, layer_sinks


def _cache(layers: int = 4) -> ContiguousCache:
    return ContiguousCache(LaneAllocator(4, 64), num_layers=layers, num_heads=4, kv_heads=2, head_dim=16,
                           dtype=torch.float32, device=torch.device("cpu"), bytes_per_token=2 * layers * 2 * 16 * 4)


@pytest.mark.parametrize("prompts,chunk", [([30, 3, 12], 100), ([30, 3, 12], 7), ([1], 1)])
def test_sinks_per_layer(prompts, chunk):
    """Sinks on a full and a sliding layer (gpt-oss), none on a full and a sliding one."""
    check_cache_sinks(_cache(), [0, 5, 0, 5], layer_sinks([True, True, False, False], 4), prompts=prompts, steps=4,
                      chunk=chunk)


def test_lanes_out_of_order_keep_each_heads_sink():
    """Sequences in lanes out of batch order (a gather or a reorder): the sinks are per head, not per sequence."""
    cache = _cache(layers=2)
    cache.allocator.admit(9, cache.allocator.plan_admit([0] * 5, total_len=6))  # lane 0 taken, then freed
    cache.allocator.admit(8, cache.allocator.plan_admit([0] * 5, total_len=6))
    cache.allocator.release(9)
    check_cache_sinks(cache, [3, 0], layer_sinks([True, True], 4), prompts=[14, 6], steps=4, chunk=8)
