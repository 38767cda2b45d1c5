"""The Orca baselines' region cache with sliding windows and attention sinks: decode masks each sequence's keys
older than its layer's window and adds the layer's sinks, as prefill does (it once attended to every key)."""

from __future__ import annotations

import pytest
import torch

from kvbench.impls.region_allocator import RegionAllocator
from kvbench.impls.region_cache import RegionCache
from kvbench.impls.reservation import reserve_oracle
from tests.helpers.sink_cases import layer_sinks
from tests.helpers.window_cases import check_cache_windows


def _cache(layers: int) -> RegionCache:
    return RegionCache(RegionAllocator(512, 64, reserve_oracle), num_layers=layers, num_heads=4, kv_heads=2,
                       head_dim=16, dtype=torch.float32, device=torch.device("cpu"),
                       bytes_per_token=2 * layers * 2 * 16 * 4)


@pytest.mark.parametrize("prompts,chunk", [([30, 3, 12], 100), ([30, 3, 12], 7)])
def test_windows_per_layer_in_decode_and_prefill(prompts, chunk):
    check_cache_windows(_cache(3), [0, 5, 16], prompts=prompts, steps=6, chunk=chunk)


def test_sinks_on_full_and_sliding_layers():
    check_cache_windows(_cache(4), [0, 5, 0, 5], prompts=[20, 9], steps=5, chunk=100,
                        sinks=layer_sinks([True, True, False, False], 4))
