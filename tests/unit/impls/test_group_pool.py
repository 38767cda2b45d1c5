"""GroupedBlockPool: randomized operations (admit, append, slide, fork, free) with the invariants after each."""

from __future__ import annotations

import random

import pytest

from kvbench.impls.attention_kinds import FullAttention, SlidingWindow, blocks_held
from kvbench.impls.group_pool import NULL, GroupedBlockPool, PoolGroup
from kvbench.impls.sizing import blocks_for_tokens

HYBRID = [PoolGroup(FullAttention(), 2, 2, 0), PoolGroup(SlidingWindow(7), 2, 2, 0), PoolGroup(SlidingWindow(7), 1, 2, 0)]
SPLIT = [PoolGroup(FullAttention(), 2, 2, 0), PoolGroup(SlidingWindow(5), 3, 3, 1)]


def _expected_nulls(pool: GroupedBlockPool, seq: int, g: int, write_start: int) -> int:
    return pool.groups[g].kind.first_needed_block(write_start, pool.block_size)


@pytest.mark.parametrize("groups,pools", [(HYBRID, [40]), (SPLIT, [20, 14])])
@pytest.mark.parametrize("seed", range(6))
def test_random_operations_keep_the_invariants(groups, pools, seed):
    rng = random.Random(seed)
    pool = GroupedBlockPool(pools, 4, groups)
    starts: dict[int, int] = {}  # seq -> where its last write started (what its drops follow)
    next_id = 0
    for _ in range(400):
        op = rng.random()
        live = list(pool.tables)
        if op < 0.25 or not live:
            prompt = [rng.randrange(50) for _ in range(rng.randint(1, 20))]
            plan = pool.plan_admit(prompt)
            if plan.fits:
                pool.admit(next_id, plan)
                starts[next_id] = 0
                next_id += 1
        elif op < 0.75:
            seq = rng.choice(live)
            n = pool.num_tokens(seq)
            k = rng.choice([1, 1, 1, 3, 9])
            before = pool.usage()
            copies = pool.try_append(seq, [1] * k)
            if copies is None:
                assert pool.usage() == before and not pool.can_append(seq, k)
            else:
                starts[seq] = n
                assert pool.num_tokens(seq) == n + k
        elif op < 0.85:
            parent = rng.choice(live)
            pool.fork(parent, next_id)
            starts[next_id] = starts[parent]
            next_id += 1
        else:
            seq = rng.choice(live)
            pool.release(seq)
            del starts[seq]
        pool.check_invariants()
        for seq, tables in pool.tables.items():
            n = pool.num_tokens(seq)
            for g, table in enumerate(tables):
                # a group holds from the first block its last write's first query read, to its last token
                nulls = _expected_nulls(pool, seq, g, starts[seq])
                assert table[:nulls] == [NULL] * nulls and NULL not in table[nulls:]
                assert len(table) == blocks_for_tokens(n, 4)
    u = pool.usage()
    assert u.reserved_tokens == u.pool_tokens - u.free_tokens and u.used_tokens <= u.reserved_tokens
    for seq in list(pool.tables):
        pool.release(seq)
    pool.check_invariants()
    assert pool.usage().reserved_tokens == 0 and pool.usage().used_tokens == 0


def test_decode_holds_the_window_and_frees_blocks_as_they_leave_it():
    pool = GroupedBlockPool([100], 4, [PoolGroup(FullAttention(), 1, 1, 0), PoolGroup(SlidingWindow(8), 1, 1, 0)])
    pool.admit(0, pool.plan_admit([0] * 30))
    assert [len(t) - t.count(NULL) for t in pool.tables[0]] == [8, 8]  # a prompt's one chunk writes every block
    for _ in range(70):
        pool.append(0, [1])
        pool.check_invariants()
        n = pool.num_tokens(0)
        held = [len(t) - t.count(NULL) for t in pool.tables[0]]
        assert held[0] == blocks_for_tokens(n, 4)
        # the window's 8 tokens (and the current one) span at most 3 blocks of 4
        assert held[1] == blocks_held(SlidingWindow(8), n, 4) <= 3
    # bytes: the full group's n tokens and the sliding group's held blocks, in layer slots
    assert pool.usage().used_tokens == 100 + sum(pool.pools[0].filled[b] for b in pool.tables[0][1] if b != NULL)


def test_a_fork_shares_blocks_and_copies_a_shared_partial_block_on_write():
    pool = GroupedBlockPool([50], 4, HYBRID)
    pool.admit(0, pool.plan_admit([0] * 10))
    reserved = pool.usage().reserved_tokens
    pool.fork(0, 1)
    assert pool.usage().reserved_tokens == reserved and pool.usage().logical_tokens == 2 * 10 * 5
    copies = pool.append(1, [1])
    assert len(copies) == 3 and all(c.num_slots == 2 for c in copies)  # each group's last block, 2 tokens in
    pool.check_invariants()


def test_split_pools_admit_only_with_room_in_both():
    pool = GroupedBlockPool([100, 2], 4, SPLIT)
    assert not pool.plan_admit([0] * 12).fits  # 3 sliding blocks, 2 in its pool
    assert pool.plan_admit([0] * 8).fits
    assert pool.max_sequence_tokens() == 8


def test_riding_then_one_append_equals_step_by_step():
    """The fast path's run: appending the ridden tokens with the due one drops exactly as one at a time."""
    for window in (5, 8, 13):
        groups = [PoolGroup(FullAttention(), 1, 1, 0), PoolGroup(SlidingWindow(window), 1, 1, 0)]
        ride, step = GroupedBlockPool([200], 4, groups), GroupedBlockPool([200], 4, groups)
        for p in (ride, step):
            p.admit(0, p.plan_admit([0] * 3))
        while ride.num_tokens(0) < 120:
            run = max(1, ride.appendable_without_alloc(0))
            for _ in range(run):
                step.append(0, [1])
            ride.append(0, [1] * run)
            assert ride.tables == step.tables and ride.usage() == step.usage()


class _StepByStep(GroupedBlockPool):
    """The same pool with no riding: the simulator asks it at every decode step."""

    def appendable_without_alloc(self, seq_id: int) -> int:
        return 0


@pytest.mark.parametrize("prefix_caching", [False, True])
@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("window", [5, 8, 13, 30])
def test_the_simulator_rides_a_grouped_pool_to_step_by_steps_figures(window, chunked, prefix_caching):
    from kvbench.harness.serving.simulator import simulate
    from kvbench.harness.serving.workload import Request

    rng = random.Random(window)
    groups = [PoolGroup(FullAttention(), 2, 2, 0), PoolGroup(SlidingWindow(window), 1, 2, 0)]
    shared = [[rng.randrange(90) for _ in range(rng.randint(4, 20))] for _ in range(3)] if prefix_caching else [[]]
    reqs = [Request(i, rng.choice(shared) + [rng.randrange(90) for _ in range(rng.randint(3, 30))],
                    rng.randint(1, 40), rng.choice([1, 2])) for i in range(30)]
    pools = [cls([40], 4, groups, prefix_caching=prefix_caching) for cls in (GroupedBlockPool, _StepByStep)]
    ride, step = (simulate(pool, reqs, 8, 64, 100, 1, chunked_prefill=chunked) for pool in pools)
    assert ride.bookkeeping_columns() == step.bookkeeping_columns() and ride.preemptions > 0
    assert pools[0].cache_hit_tokens == pools[1].cache_hit_tokens
    assert pools[0].evicted_blocks == pools[1].evicted_blocks and (pools[0].cache_hit_tokens > 0) == prefix_caching
