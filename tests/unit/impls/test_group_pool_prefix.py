"""GroupedBlockPool's prefix cache and chunk-by-chunk admission, case by case: a sliding group's hit needs only
its window before the hit point (NULL entries before it), freed blocks stay cached (LRU) until their pages are
needed, and an admission of a first chunk holds only that chunk's blocks (and its first query's window)."""

from __future__ import annotations

from kvbench.impls.attention_kinds import FullAttention, SlidingWindow
from kvbench.impls.group_pool import NULL, GroupedBlockPool, PoolGroup

BS = 4
FULL_SLIDING = [PoolGroup(FullAttention(), 1, 1, 0), PoolGroup(SlidingWindow(8), 1, 1, 0)]
A = list(range(100, 128))  # 28 tokens: 7 full blocks


def _a_decoded_then_released(pool: GroupedBlockPool) -> None:
    """Sequence 0: A's first 16 tokens as a prompt, then 12 decode tokens (its sliding group drops blocks 0-4 as
    the window passes: they are cached, least recently freed first), then released (the rest cached after)."""
    pool.admit(0, pool.plan_admit(A[:16]))
    for t in A[16:]:
        pool.append(0, [t])
        pool.check_invariants()
    assert pool.tables[0][1][:5] == [NULL] * 5
    pool.release(0)
    pool.check_invariants()
    assert [len(p.cached) for p in pool.pools] == [14] and pool.evicted_blocks == 0


def test_a_sliding_group_hits_with_only_its_window_cached():
    pool = GroupedBlockPool([20], BS, FULL_SLIDING, prefix_caching=True)
    _a_decoded_then_released(pool)
    sliding_blocks = list(pool.pools[0].cached)[:2]  # its blocks 0 and 1, freed first
    # Another prompt takes the 6 never-cached blocks and evicts the two oldest cached ones.
    pool.admit(1, pool.plan_admit(list(range(16))))
    assert pool.evicted_blocks == 2 and set(sliding_blocks) <= set(pool.tables[1][0] + pool.tables[1][1])
    plan = pool.plan_admit(A[:25])
    # 6 blocks hit: the full group holds all 6, the sliding group the two its next query (position 24) reads
    assert plan.cached_tokens == 24
    assert plan.hits[1][:4] == (NULL,) * 4 and NULL not in plan.hits[1][4:] and NULL not in plan.hits[0]
    assert pool.admit(2, plan) == 24 and pool.cache_hit_tokens == 24
    pool.check_invariants()
    assert pool.tables[2][1][:4] == [NULL] * 4 and pool.dropped[2] == [0, 4]


def test_no_hit_when_no_window_of_the_sliding_group_is_left():
    pool = GroupedBlockPool([20], BS, FULL_SLIDING, prefix_caching=True)
    _a_decoded_then_released(pool)
    pool.admit(1, pool.plan_admit(list(range(22))))  # 12 blocks: the 6 free and 6 cached (sliding 0-4, full 6)
    assert pool.evicted_blocks == 6
    # The full group still holds A's first 6 blocks, but every point's window misses a sliding block.
    assert pool.plan_admit(A[:25]).cached_tokens == 0


def test_a_released_prompt_is_revived_and_counted():
    pool = GroupedBlockPool([10], BS, FULL_SLIDING, prefix_caching=True)
    pool.admit(0, pool.plan_admit(A[:13]))
    pool.release(0)
    assert pool.usage().reserved_tokens == 0 and pool.usage().free_tokens == pool.usage().pool_tokens
    plan = pool.plan_admit(A[:13])
    assert plan.cached_tokens == 12 and plan.fits
    pool.admit(1, plan)
    pool.check_invariants()
    # the full group holds the 3 hit blocks again, the sliding group the 2 its next query (position 12) reads;
    # each one new block for the 13th token
    assert [t.count(NULL) for t in pool.tables[1]] == [0, 1]
    assert pool.usage().reserved_tokens == 7 * BS and pool.cache_hit_tokens == 12
    # a prompt of only full blocks recomputes its last one
    assert pool.plan_admit(A[:12]).cached_tokens == 8


def test_without_prefix_caching_nothing_is_hashed_or_hit():
    pool = GroupedBlockPool([10], BS, FULL_SLIDING)
    pool.admit(0, pool.plan_admit(A[:13]))
    pool.release(0)
    assert pool.plan_admit(A[:13]).cached_tokens == 0 and not pool.pools[0].by_key and not pool.pools[0].cached


def test_an_admission_by_chunk_holds_only_its_chunks_blocks():
    groups = [PoolGroup(FullAttention(), 1, 1, 0), PoolGroup(SlidingWindow(10), 1, 1, 0)]
    whole, by_chunk = GroupedBlockPool([100], BS, groups), GroupedBlockPool([100], BS, groups)
    prompt = list(range(40))
    whole.admit(0, whole.plan_admit(prompt))
    assert [len(t) - t.count(NULL) for t in whole.tables[0]] == [10, 10]  # one chunk: every block, both groups
    plan = by_chunk.plan_admit(prompt, chunk_tokens=8)
    assert plan.end == 8
    by_chunk.admit(0, plan)
    assert by_chunk.num_tokens(0) == 8 and [len(t) for t in by_chunk.tables[0]] == [2, 2]
    for start in range(8, 40, 8):
        by_chunk.append(0, prompt[start:start + 8])
        by_chunk.check_invariants()
        sliding = by_chunk.tables[0][1]
        # NULL before the window of the chunk's first query; at most ceil((10 - 1 + 8) / 4) + 1 blocks held
        assert sliding.count(NULL) == max(0, start - 9) // BS and len(sliding) - sliding.count(NULL) <= 6
    assert by_chunk.num_tokens(0) == 40
    assert by_chunk.usage().reserved_tokens < whole.usage().reserved_tokens


def test_a_chunk_plan_reserves_after_its_hit():
    pool = GroupedBlockPool([40], BS, FULL_SLIDING, prefix_caching=True)
    pool.admit(0, pool.plan_admit(A))
    plan = pool.plan_admit(A + [1, 2, 3], chunk_tokens=5)
    assert plan.cached_tokens == 28 and plan.end == 31  # the hit, then at most 5 tokens: the prompt's 3 left
    pool.admit(1, plan)
    pool.check_invariants()
    assert pool.num_tokens(1) == 31
