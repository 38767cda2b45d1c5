"""PagedCache on the flex kernel (conf/impl/paged_flex.yaml): decode steps through FlexAttention over the page
tables (eager on CPU) equal the loop-stated attention in every layer (full, sliding-window, with and without
sinks) over several steps."""

from __future__ import annotations

import pytest
import torch

from kvbench.impls.block_manager import BlockManager
from kvbench.impls.paged import PagedCache
from kvbench.kernels.registry import get_paged_kernel
from kvbench.kernels.validate import KernelArgumentError
from tests.helpers.sink_cases import check_cache_sinks, layer_sinks
from tests.helpers.window_cases import check_cache_windows


def _cache(block_size: int, layers: int = 3, **kwargs) -> PagedCache:
    return PagedCache(get_paged_kernel("flex"), BlockManager(64, block_size), num_layers=layers, num_heads=4,
                      kv_heads=2, head_dim=32, dtype=torch.float32, device=torch.device("cpu"),
                      bytes_per_token=2 * layers * 2 * 32 * 4, **kwargs)


@pytest.mark.parametrize("block_size,chunk", [(8, 7), (16, 16)])
def test_decode_steps_through_windows(block_size, chunk):
    check_cache_windows(_cache(block_size), [0, 5, 17], prompts=[30, 3, 12], steps=5, chunk=chunk)


def test_decode_steps_with_sinks_on_some_layers():
    """gpt-oss's layout in small: a sliding and a full layer with sinks beside a full and a sliding one without."""
    check_cache_sinks(_cache(8, layers=4), [5, 0, 0, 17], layer_sinks([True, True, False, False], 4),
                      prompts=[30, 3, 12], steps=5, chunk=7)


@pytest.mark.parametrize("kv_dtype", ["int8", "fp8_e4m3"])
def test_a_quantized_cache_is_refused_in_one_line(kv_dtype):
    with pytest.raises(KernelArgumentError, match=f"kernel flex reads kv_dtype auto, not {kv_dtype}"):
        _cache(8, kv_dtype=kv_dtype)
