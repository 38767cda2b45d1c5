"""PagedCache: its host-tier copies (every block store goes to the host buffer and back, stores first), and the
read its kernel makes, as its allocator reports it."""

from __future__ import annotations

import torch

from kvbench.impls.block_manager import BlockManager
from kvbench.impls.host_tier import HostCopies
from kvbench.impls.paged import PagedCache
from kvbench.kernels.registry import get_paged_kernel


def _cache(num_blocks: int, host_blocks: int, kernel: str = "torch") -> PagedCache:
    bm = BlockManager(num_blocks, 4, host_blocks=host_blocks)
    return PagedCache(get_paged_kernel(kernel), bm, num_layers=3, num_heads=4, kv_heads=2, head_dim=8,
                      dtype=torch.float32, device=torch.device("cpu"), bytes_per_token=2 * 3 * 2 * 8 * 4)


def test_copies_move_every_store_of_a_block_stores_first():
    cache = _cache(6, 5)
    gen = torch.Generator().manual_seed(1)
    for store in cache.block_stores():
        store.copy_(torch.randn(store.shape, generator=gen))
    assert len(cache.block_stores()) == 6 and len(cache.host_buffers) == 6  # K and V of 3 layers
    before = [s.clone() for s in cache.block_stores()]
    # Block 2 goes to slot 3, block 4 to slot 0 (slot 0 first held block 1: a slot stored twice keeps the
    # later); then slot 3 comes back into block 4, after its own store has left.
    cache.copy_host(HostCopies(stores=((1, 0), (2, 3), (4, 0)), loads=((4, 3),)))
    for store, buf, old in zip(cache.block_stores(), cache.host_buffers, before):
        assert torch.equal(buf[3], old[2]) and torch.equal(buf[0], old[4])
        assert torch.equal(store[4], old[2])  # loaded back from slot 3
        assert torch.equal(store[[0, 1, 2, 3, 5]], old[[0, 1, 2, 3, 5]])  # nothing else written


def test_no_tier_no_host_buffers():
    cache = _cache(4, 0)
    assert cache.host_buffers == []
    cache.copy_host(HostCopies())  # nothing to do


def test_the_reference_kernels_read_is_the_batchs_longest_context_for_every_sequence():
    """paged_torch's gather attends a [batch, longest] window (masked), so its steps record batch x longest
    KV tokens read; the C++ kernel (the cuda op's CPU kernel) reads each sequence's own context."""
    reference, cpp = _cache(8, 0, "torch").allocator, _cache(8, 0, "cuda").allocator
    assert reference.padded_decode_read and not cpp.padded_decode_read
    assert reference.decode_read_tokens([3, 10, 5]) == 30 and cpp.decode_read_tokens([3, 10, 5]) == 18
