"""A linear-attention group's state slots in the grouped pool (Qwen3-Next's layout: a full group beside state
groups of as many layers): one state per sequence, taken at admission, the same pages however long it grows,
freed at release or preemption, copied at the first write after a fork; prefix caching off with its note; and
the invariants (impls/group_checks.py) after every operation of a random schedule."""

from __future__ import annotations

import random

import pytest

from kvbench.impls.attention_kinds import FullAttention, LinearState, blocks_held
from kvbench.impls.group_pool import GroupedBlockPool, PoolGroup

BS = 4
STATE = LinearState(state_tokens=10)  # 3 pages of 4 slots: 2 slots of padding
# Qwen3-Next's 1:3, cut in groups of the full kind's 2 layers: one full group, three state groups.
LAYOUT = [PoolGroup(FullAttention(), 2, 2, 0)] + [PoolGroup(STATE, 2, 2, 0)] * 3


def pool(blocks: int = 200, prefix_caching: bool = False) -> GroupedBlockPool:
    return GroupedBlockPool([blocks], BS, LAYOUT, prefix_caching=prefix_caching)


def held(p: GroupedBlockPool) -> int:
    return p.pools[0].num_blocks - p.pools[0].available


def test_a_state_is_taken_at_admission_and_never_grows() -> None:
    p = pool()
    plan = p.plan_admit(list(range(5)))
    p.admit(1, plan)
    p.check_invariants()
    assert held(p) == 2 + 3 * 3  # the prompt's 2 blocks in the full group, 3 pages in each state group
    for _ in range(30):
        p.append(1, [7])
        p.check_invariants()
    assert held(p) == blocks_held(FullAttention(), 35, BS) + 3 * 3 == 9 + 9
    u = p.usage()
    # used: 35 tokens x 2 full layers, and 10 slots x 2 layers per state group; the state's padding is waste
    assert u.used_tokens == 35 * 2 + 3 * 10 * 2
    assert u.fragmentation_tokens == (36 - 35) * 2 + 3 * (12 - 10) * 2
    p.release(1)
    p.check_invariants()
    assert held(p) == 0 and p.usage().used_tokens == 0


def test_admission_needs_room_for_the_state() -> None:
    p = pool(blocks=10)  # 1 block for a 3-token prompt, 9 pages of states: 10
    assert p.plan_admit([1, 2, 3]).fits
    p.admit(1, p.plan_admit([1, 2, 3]))
    assert not p.plan_admit([4]).fits  # nothing left for another state
    assert blocks_held(STATE, 1, BS) == blocks_held(STATE, 10_000, BS) == 3


def test_a_fork_shares_the_state_until_either_writes() -> None:
    p = pool()
    p.admit(1, p.plan_admit([1, 2, 3, 4, 5, 6]))
    before = held(p)
    p.fork(1, 2)
    p.check_invariants()
    assert held(p) == before  # shared
    assert p.can_append(2, 1)
    copies = p.append(2, [9])
    p.check_invariants()
    # the child's own state: 9 pages copied (and the shared partly filled full block copied on write)
    assert held(p) == before + 9 + 1 and sum(c.num_slots for c in copies) == 3 * 10 + 2
    p.append(1, [8])  # the parent's state is its own again: no copy
    p.check_invariants()
    assert held(p) == before + 10


def test_prefix_caching_is_off_with_a_note() -> None:
    p = pool(prefix_caching=True)
    assert not p.prefix_caching and "recurrent state" in p.prefix_note
    prompt = list(range(12))
    p.admit(1, p.plan_admit(prompt))
    p.release(1)
    assert p.plan_admit(prompt).cached_tokens == 0
    assert pool().prefix_note is None  # nothing asked, nothing said


@pytest.mark.parametrize("seed", range(6))
def test_random_schedules_keep_the_invariants(seed: int) -> None:
    rng = random.Random(seed)
    p = pool(blocks=rng.choice([40, 80]))
    live: list[int] = []
    next_id = 0
    for _ in range(250):
        op = rng.random()
        if op < 0.3 or not live:
            prompt = [rng.randrange(9) for _ in range(rng.randint(1, 20))]
            plan = p.plan_admit(prompt, chunk_tokens=rng.choice([None, 3, 8]))
            if plan.fits:
                p.admit(next_id, plan)
                live.append(next_id)
            next_id += 1
        elif op < 0.75:
            s = rng.choice(live)
            n = rng.randint(1, 5)
            if p.can_append(s, n):
                p.append(s, [rng.randrange(9) for _ in range(n)])
            else:  # preempted (recompute): its blocks and its state go back
                p.release(s)
                live.remove(s)
        elif op < 0.85:
            s = rng.choice(live)
            p.fork(s, next_id)
            live.append(next_id)
            next_id += 1
        else:
            s = rng.choice(live)
            p.release(s)
            live.remove(s)
        p.check_invariants()
        for s in live:  # every live sequence holds exactly its state pages in each state group
            for g, table in zip(p.groups, p.tables[s]):
                if g.kind.state_tokens is not None:
                    assert len(table) == 3
    for s in list(live):
        p.release(s)
    p.check_invariants()
    assert held(p) == 0
