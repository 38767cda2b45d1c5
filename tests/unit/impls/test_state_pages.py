"""Linear-attention states in the pool's pages (impls/state_pages.py) through GroupedPagedCache: a state's bytes in
the pool are its size rounded up to whole pages, exactly; a step reads back what the last one wrote, zeros at a
sequence's first write whatever its recycled pages held; the values sit in the sequence's own pages (a write to
one sequence leaves another's alone); a fork's first write copies them whole."""

from __future__ import annotations

import pytest
import torch

from kvbench.harness.kv.groups import kv_groups, layer_bytes_per_token
from kvbench.harness.kv.latent import state_bytes_per_seq, state_tokens, state_values_per_layer, values_per_token
from kvbench.harness.model.config import ModelConfig
from kvbench.impls.base import PrefillSpan
from kvbench.impls.group_pool import GroupedBlockPool, PoolGroup
from kvbench.impls.grouped_paged import GroupedPagedCache
from kvbench.impls.sizing import blocks_for_tokens
from kvbench.kernels.registry import get_paged_kernel

# Qwen3-Next's 3 linear layers to 1 full one; a state of 2 x 16 x 24 + 112 x 3 = 1104 values, 4.3 tokens of
# K/V (2 x 2 x 64 = 256 values): 5 slots.
CFG = ModelConfig(architecture="qwen3_next", num_layers=4, num_heads=4, num_kv_heads=2, head_dim=64,
                  layer_types=["linear_attention"] * 3 + ["full_attention"], linear_num_key_heads=2,
                  linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=24,
                  linear_conv_kernel_dim=4)


def _cache(block_size: int, blocks: int = 64) -> GroupedPagedCache:
    groups = kv_groups(CFG, "hybrid")
    pool = GroupedBlockPool([blocks], block_size, [PoolGroup(g.kind, g.num_layers, g.page_layers, g.pool)
                                                   for g in groups])
    return GroupedPagedCache(get_paged_kernel("torch"), pool, [g.layers for g in groups], num_layers=4, num_heads=4,
                             kv_heads=2, head_dim=64, dtype=torch.float32, device=torch.device("cpu"),
                             bytes_per_token=layer_bytes_per_token(CFG, "float32"))


def _admit(cache: GroupedPagedCache, seq_id: int, tokens: int) -> None:
    pool = cache.allocator
    pool.admit(seq_id, pool.plan_admit(list(range(tokens))))


@pytest.mark.parametrize("block_size", [1, 2, 4, 8, 16])
def test_the_state_bytes_in_the_pool_are_its_size_rounded_to_pages(block_size):
    cache = _cache(block_size)
    _admit(cache, 0, 7)
    meta = cache.prepare_prefill([PrefillSpan(0, 0, 7)])
    page_bytes = block_size * layer_bytes_per_token(CFG, "float32")  # K and V of one layer, a page of tokens
    slots = state_tokens(CFG)
    assert slots == 5
    for layer in range(3):  # the linear layers
        rows = cache.linear_state(layer, meta)
        held = rows.capacity * 4
        assert held == blocks_for_tokens(slots, block_size) * page_bytes
        assert held >= state_values_per_layer(CFG) * 4 > held - page_bytes  # less than a page of padding
        assert held >= slots * values_per_token(CFG) * 4  # the slots the pool counts (harness/kv/latent.py)
    pages = sum(len(cache.allocator.tables[0][g]) for g in cache.state_groups)
    assert pages * page_bytes >= state_bytes_per_seq(CFG, 4)
    with pytest.raises(ValueError, match="full group, which keeps no linear-attention state"):
        cache.linear_state(3, meta)


def test_a_step_reads_what_the_last_wrote_and_zeros_at_the_first_write():
    cache = _cache(4)
    # recycled pages: garbage (a NaN too) wherever no state was written
    for store in cache.block_stores():
        store.fill_(float("nan"))
    _admit(cache, 0, 6)
    _admit(cache, 1, 3)
    first = cache.prepare_prefill([PrefillSpan(0, 0, 6), PrefillSpan(1, 0, 3)])
    rows = cache.linear_state(1, first)
    assert rows.lengths == (6, 3)
    assert torch.equal(rows.read(), torch.zeros(2, rows.capacity))
    written = torch.randn(2, 1000)
    rows.write(written)
    for seq in (0, 1):
        cache.allocator.append(seq, [9])
    decode = cache.prepare_decode([1, 0])  # another order: each reads its own pages
    again = cache.linear_state(1, decode).read()
    assert again.shape == (2, rows.capacity) and again[:, 1000:].eq(0).all()  # the rest of the region zeroed
    assert torch.equal(again[:, :1000], written[[1, 0]])
    assert not torch.equal(again[:, :1000], written)  # the comparison can fail: order matters
    assert cache.linear_state(0, decode).read().isnan().all()  # layer 0 never written: its pages as they were


def test_the_state_is_the_bytes_of_the_sequences_own_pages():
    cache = _cache(4)
    _admit(cache, 0, 2)
    _admit(cache, 1, 2)
    meta = cache.prepare_prefill([PrefillSpan(1, 0, 2)])
    layer = 2
    group = cache.group_of[layer]
    cache.linear_state(layer, meta).write(torch.arange(1.0, 11.0)[None])
    first_page = cache.allocator.tables[1][group][0]
    assert torch.equal(cache.k[layer][first_page].flatten()[:10], torch.arange(1.0, 11.0))
    other = cache.allocator.tables[0][group][0]
    assert cache.k[layer][other].eq(0).all()  # sequence 0's pages untouched


def test_a_forks_first_write_copies_the_state_whole():
    cache = _cache(4)
    _admit(cache, 0, 5)
    meta = cache.prepare_prefill([PrefillSpan(0, 0, 5)])
    state = torch.randn(1, cache.linear_state(0, meta).capacity)
    cache.linear_state(0, meta).write(state)
    cache.allocator.fork(0, 1)
    copies = cache.allocator.append(1, [3])  # the child writes first: its state moves to pages of its own
    cache.copy_slots(copies)
    cache.allocator.append(0, [4])
    assert cache.allocator.tables[0][0] != cache.allocator.tables[1][0]
    decode = cache.prepare_decode([0, 1])
    read = cache.linear_state(0, decode).read()
    assert torch.equal(read, torch.cat([state, state]))
    cache.linear_state(0, decode).write(torch.stack([state[0], -state[0]]))  # then each goes its own way
    assert torch.equal(cache.linear_state(0, decode).read()[1], -state[0])


def test_the_longest_prompt_leaves_room_for_every_states_pages():
    """64 pages of 4 slots: 3 state groups take 2 pages each, whatever the length; the full group the other 58."""
    cache = _cache(4)
    assert [cache.allocator.groups[g].kind.state_blocks(4) for g in cache.state_groups] == [2, 2, 2]
    assert cache.allocator.max_sequence_tokens() == (64 - 6) * 4
    _admit(cache, 0, (64 - 6) * 4)  # fits exactly
    assert cache.allocator.pools[0].available == 0
