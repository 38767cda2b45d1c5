"""PagedCache with sliding-window layers: prefill (whole and chunked across the window's edge) and decode through
each kernel mask keys older than a layer's window, and a full-attention layer beside them attends to all."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvbench.impls.block_manager import BlockManager
from kvbench.impls.paged import PagedCache
from kvbench.kernels.registry import get_paged_kernel
from tests.helpers.window_cases import check_cache_windows


def _cache(kernel: str, block_size: int, layers: int = 3) -> PagedCache:
    return PagedCache(get_paged_kernel(kernel), BlockManager(256, block_size), num_layers=layers, num_heads=4,
                      kv_heads=2, head_dim=64, dtype=torch.float32, device=torch.device("cpu"),
                      bytes_per_token=2 * layers * 2 * 64 * 4)


@pytest.mark.parametrize("kernel", ["torch", "cuda"])
@pytest.mark.parametrize("block_size,chunk", [(1, 100), (8, 7), (16, 16)])
def test_windows_per_layer(kernel, block_size, chunk):
    check_cache_windows(_cache(kernel, block_size), [0, 5, 17], prompts=[30, 3, 12], steps=9, chunk=chunk)


def test_triton_windows_in_the_interpreter():
    pytest.importorskip("triton")
    check_cache_windows(_cache("triton", 8, layers=2), [0, 6], prompts=[20, 4], steps=3, chunk=9)


def test_no_window_keeps_the_kernel_call_unchanged(monkeypatch):
    """A full-attention layer passes no window argument: the kernels' full-attention path, as before."""
    cache = _cache("torch", 8, layers=2)
    cache.set_layer_windows([0, 4])
    calls, real = [], cache.kernel.decode

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(cache, "kernel", dataclasses.replace(cache.kernel, decode=spy))
    check_cache_windows(cache, [0, 4], prompts=[9], steps=1, chunk=9)
    assert "window" not in calls[0] and calls[1]["window"] == 4


@pytest.mark.parametrize("windows", [[0], [0, 4, 1], [0, -2], [0, 2.5]])
def test_bad_windows_are_refused(windows):
    with pytest.raises(ValueError, match="windows must be 2 ints >= 0"):
        _cache("torch", 8, layers=2).set_layer_windows(windows)


@pytest.mark.parametrize("kernel", ["torch", "cuda"])
def test_blocks_before_the_window_are_not_read(kernel):
    """A chunk's prefill gathers from the block of its first query's oldest key, and the op's decode skips the
    blocks before its window: NaN there reaches no output (the torch reference's decode masks them instead,
    reading whole padded rows, so it is left out of the decode half)."""
    from kvbench.impls.base import PrefillSpan

    cache = _cache(kernel, 4, layers=1)
    cache.set_layer_windows([4])
    alloc = cache.allocator
    alloc.admit(0, alloc.plan_admit(list(range(20)), total_len=21))
    gen = torch.Generator().manual_seed(0)

    def qkv(rows):
        return (torch.randn(rows, 4, 64, generator=gen), torch.randn(rows, 2, 64, generator=gen),
                torch.randn(rows, 2, 64, generator=gen))

    cache.forward_prefill(0, *qkv(16), cache.prepare_prefill([PrefillSpan(0, 0, 16)]))
    stale = torch.tensor(alloc.block_table(0)[:3])  # tokens 0-11; the next chunk's queries 16-19 read 13 on
    cache.k[0][stale] = float("nan")
    cache.v[0][stale] = float("nan")
    assert torch.isfinite(cache.forward_prefill(0, *qkv(4), cache.prepare_prefill([PrefillSpan(0, 16, 20)]))).all()
    if kernel == "cuda":
        alloc.append(0, [0])
        assert torch.isfinite(cache.forward_decode(0, *qkv(1), cache.prepare_decode([0]))).all()
