"""Eviction policies: randomized operation sequences against plain models, and the reuse each keeps."""

from __future__ import annotations

import random

import pytest

from kvbench.impls.eviction import POLICIES, eviction_policy


def _random_ops(policy, seed: int, steps: int = 3000, blocks: int = 40):
    """Drive ``policy`` as a block manager would; yield (op, block, popped) after checking the set invariants."""
    rng = random.Random(seed)
    members: set[int] = set()
    for _ in range(steps):
        r = rng.random()
        outside = [b for b in range(blocks) if b not in members]
        if r < 0.35 and outside:
            b = rng.choice(outside)
            policy.add(b)
            members.add(b)
            yield "add", b, None
        elif r < 0.5 and members:
            b = rng.choice(sorted(members))
            policy.hit(b)
            policy.remove(b)  # a hit on an evictable block revives it
            members.discard(b)
            yield "revive", b, None
        elif r < 0.65:
            b = rng.randrange(blocks)
            if b not in members:
                policy.hit(b)  # a hit on a block in use
                yield "hit", b, None
        elif r < 0.7:
            b = rng.choice(outside) if outside else None
            if b is not None:
                policy.forget(b)  # an in-use block given new contents
                yield "forget", b, None
        elif members:
            v = policy.pop()
            assert v in members, "the victim was not evictable"
            members.discard(v)
            yield "pop", v, v
        assert len(policy) == len(members) and set(policy) == members
        assert all(b in policy for b in members) and sum(1 for _ in policy) == len(members)


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("seed", range(4))
def test_random_sequences_keep_the_evictable_set(name, seed):
    for _ in _random_ops(eviction_policy(name, 40), seed):
        pass


@pytest.mark.parametrize("seed", range(3))
def test_lru_and_lfu_pick_the_victims_their_definitions_name(seed):
    """Plain models of both definitions, recomputed from scratch at every pop."""
    for name in ("lru", "lfu"):
        policy = eviction_policy(name, 40)
        added_at: dict[int, int] = {}
        priority: dict[int, int] = {}
        hits: dict[int, int] = {}
        age, clock = 0, 0
        for op, b, popped in _random_ops(policy, seed):
            clock += 1
            if op == "add":
                added_at[b], priority[b] = clock, hits.get(b, 0) + age
            elif op in ("hit", "revive"):
                hits[b] = hits.get(b, 0) + 1
                if op == "revive":
                    del added_at[b], priority[b]
            elif op == "forget":
                hits.pop(b, None)
            else:
                key = (lambda x: added_at[x]) if name == "lru" else (lambda x: (priority[x], added_at[x]))
                candidates = list(added_at) + [popped]
                expected = min(set(candidates), key=key)
                assert popped == expected, (name, op)
                if name == "lfu":
                    age = priority[popped]
                del added_at[popped], priority[popped]
                hits.pop(popped, None)


def _survivors(name: str, reused: int = 4, scan: int = 30) -> set[int]:
    """Blocks 0..reused-1 hold a prefix reused 3 times; then a scan of one-off blocks is freed and
    half of them must be evicted. Which reused blocks are still cached?"""
    policy = eviction_policy(name, 40)
    for b in range(reused):
        policy.add(b)
    for _ in range(3):
        for b in range(reused):
            policy.hit(b)
            policy.remove(b)
        for b in range(reused):
            policy.add(b)
    for b in range(reused, reused + scan):
        policy.add(b)  # one-off prompts' blocks, freed after the reused prefix
    for _ in range(scan // 2 + reused):
        policy.pop()
    return {b for b in range(reused) if b in policy}


def test_frequency_and_scan_resistant_policies_keep_a_reused_prefix_through_a_scan():
    assert _survivors("lru") == set()  # the prefix was freed first, so it goes first
    assert _survivors("lfu") == set(range(4))
    assert _survivors("2q") == set(range(4))


def test_lfu_ages_out_a_block_popular_long_ago():
    policy = eviction_policy("lfu", 40)
    policy.add(0)
    for _ in range(3):
        policy.hit(0)
        policy.remove(0)
        policy.add(0)  # block 0: 3 hits, priority 3
    victims = []
    for round_ in range(20):  # newer blocks each hit once; the age rises with every victim
        for b in (10 + 2 * round_, 11 + 2 * round_):
            policy.hit(b)
            policy.add(b)
        victims.append(policy.pop())
    assert victims[0] != 0 and 0 in victims  # kept while popular, but not forever


def test_2q_demotes_its_least_recent_protected_block_over_its_share():
    policy = eviction_policy("2q", 4)  # protected: at most 3 blocks
    for b in range(5):
        policy.hit(b)
        policy.add(b)
    assert list(policy.protected) == [2, 3, 4] and list(policy.probation) == [0, 1]
    assert [policy.pop() for _ in range(5)] == [0, 1, 2, 3, 4]


def test_an_unknown_policy_names_the_allowed_ones():
    with pytest.raises(ValueError, match="choose one of lru, lfu, 2q"):
        eviction_policy("fifo", 40)
