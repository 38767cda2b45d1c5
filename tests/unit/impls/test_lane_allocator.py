"""LaneAllocator (the contiguous cache's bookkeeping): random operation sequences checked against a model."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.impls.allocator import StalePlanError
from kvbench.impls.lane_allocator import LaneAllocator


def check_against_model(alloc: LaneAllocator, lengths: dict[int, int]) -> None:
    """Everything the allocator reports follows from the live sequences and their lengths."""
    lanes, seq_len = alloc.num_lanes, alloc.max_seq_len
    held = {sid: alloc.lane(sid) for sid in lengths}
    assert len(set(held.values())) == len(held), "two sequences share a lane"
    assert set(held.values()).isdisjoint(alloc.free) and len(alloc.free) == len(set(alloc.free))
    assert set(held.values()) | set(alloc.free) == set(range(lanes))
    slots_seen: set[int] = set()
    for sid, n in lengths.items():
        assert alloc.num_tokens(sid) == n <= seq_len
        token_slots = alloc.slots(sid, 0, n)
        # A sequence's tokens are consecutive token slots inside its own lane of the slab.
        assert token_slots == list(range(held[sid] * seq_len, held[sid] * seq_len + n))
        assert slots_seen.isdisjoint(token_slots)
        slots_seen.update(token_slots)
        assert alloc.can_append(sid, seq_len - n) and not alloc.can_append(sid, seq_len - n + 1)
        assert alloc.appendable_without_alloc(sid) == seq_len - n
    written = sum(lengths.values())
    u = alloc.usage()
    assert u.pool_tokens == lanes * seq_len
    assert u.reserved_tokens == len(lengths) * seq_len  # a whole lane from admission on
    assert u.used_tokens == u.logical_tokens == written  # no sharing: every token has its own slot
    assert u.reservation_waste_tokens == u.reserved_tokens - written
    assert u.fragmentation_tokens == 0
    assert u.num_sequences == len(lengths)
    assert u.free_tokens == (lanes - len(lengths)) * seq_len


def _run_ops(seed: int, num_lanes: int, max_seq_len: int, steps: int) -> None:
    rng = random.Random(seed)
    alloc = LaneAllocator(num_lanes, max_seq_len)
    lengths: dict[int, int] = {}  # the model: live sequence -> tokens
    next_id = 0
    old_plan = None  # a plan kept past a change of state: admitting it must raise
    for _ in range(steps):
        op = rng.choice(["admit", "admit", "append", "append", "append", "fork", "release"])
        if op == "admit":
            prompt = [rng.randrange(50) for _ in range(rng.randint(1, max_seq_len + 2))]
            samples = rng.randint(1, 3)
            fits = len(prompt) <= max_seq_len and num_lanes - len(lengths) >= samples
            plan = alloc.plan_admit(prompt, samples)
            assert plan.fits == fits == alloc.can_admit(prompt, samples)
            assert plan.cached_tokens == 0  # no prefix cache
            if old_plan is not None and old_plan.fits and old_plan.generation != alloc.generation:
                free_before = list(alloc.free)
                with pytest.raises(StalePlanError):
                    alloc.admit(next_id, old_plan)
                assert alloc.free == free_before and next_id not in lengths  # nothing happened
            old_plan = plan
            if fits:
                assert alloc.admit(next_id, plan) == 0
                lengths[next_id] = len(prompt)
                next_id += 1
        elif op == "append" and lengths:
            sid = rng.choice(list(lengths))
            k = rng.randint(1, 4)
            assert alloc.can_append(sid, k) == (lengths[sid] + k <= max_seq_len)
            if alloc.can_append(sid, k):
                assert alloc.append(sid, [rng.randrange(50) for _ in range(k)]) == []  # never a copy
                lengths[sid] += k
        elif op == "fork" and lengths and len(lengths) < num_lanes:
            parent = rng.choice(list(lengths))
            n = lengths[parent]
            copies = alloc.fork(parent, next_id)
            lengths[next_id] = n
            # The child's lane starts as a copy of the parent's tokens.
            assert [(c.src, c.dst, c.num_slots) for c in copies] == [
                (alloc.slots(parent, 0, 1)[0], alloc.slots(next_id, 0, 1)[0], n)]
            next_id += 1
        elif op == "release" and lengths:
            sid = rng.choice(list(lengths))
            lane = alloc.lane(sid)
            alloc.release(sid)
            del lengths[sid]
            assert lane in alloc.free
        check_against_model(alloc, lengths)
    for sid in list(lengths):
        alloc.release(sid)
    check_against_model(alloc, {})


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), num_lanes=st.integers(1, 8), max_seq_len=st.integers(1, 24))
def test_random_operations_match_the_model(seed, num_lanes, max_seq_len):
    _run_ops(seed, num_lanes, max_seq_len, steps=80)


def test_fresh_lanes_are_handed_out_in_order():
    """Lane 0 first, then 1, ...: sequences admitted together hold one dense range of the slab."""
    alloc = LaneAllocator(4, 8)
    for sid in range(3):
        alloc.admit(sid, alloc.plan_admit([1, 2]))
    assert [alloc.lane(sid) for sid in range(3)] == [0, 1, 2]


def test_a_released_lane_is_reused_whole():
    alloc = LaneAllocator(2, 8)
    alloc.admit(0, alloc.plan_admit([1] * 8))
    alloc.admit(1, alloc.plan_admit([2, 3]))
    assert not alloc.can_admit([4])  # both lanes held, whatever their lengths
    alloc.release(0)
    assert alloc.can_admit([4] * 8) and not alloc.can_admit([4] * 9)  # the whole lane, not its leftover
    alloc.admit(2, alloc.plan_admit([4] * 8))
    assert alloc.slots(2, 0, 8) == list(range(0, 8))


@pytest.mark.parametrize("bad", [0, -1])
def test_rejects_an_empty_pool(bad):
    with pytest.raises(ValueError, match="num_lanes"):
        LaneAllocator(bad, 8)


def test_a_plan_that_does_not_fit_is_refused():
    alloc = LaneAllocator(1, 8)
    plan = alloc.plan_admit([1] * 9)
    assert not plan.fits
    with pytest.raises(ValueError, match="does not fit"):
        alloc.admit(0, plan)
    assert alloc.usage().num_sequences == 0


def test_try_append_appends_what_fits_and_refuses_the_rest():
    """The allocator interface's default ``try_append``: ``append`` when ``can_append``, else None, nothing changed."""
    alloc = LaneAllocator(num_lanes=2, max_seq_len=8)
    alloc.admit(0, alloc.plan_admit([1, 2, 3]))
    assert alloc.try_append(0, [4] * 5) == [] and alloc.num_tokens(0) == 8
    assert alloc.try_append(0, [5]) is None and alloc.num_tokens(0) == 8
