"""RegionAllocator (Orca (Pow2) / Orca (Oracle)): random operations checked against a slot-by-slot model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.impls.allocator import SlotCopy, StalePlanError
from kvbench.impls.region_allocator import RegionAllocator
from kvbench.impls.reservation import RESERVATIONS, reserve_oracle, reserve_pow2

MAX_SEQ_LEN = 48


def _owners(alloc: RegionAllocator) -> list[int | None]:
    """Slot -> the sequence whose region holds it; asserts no two regions overlap."""
    owner: list[int | None] = [None] * alloc.pool_tokens
    for seq, (start, slots) in alloc.region.items():
        assert 0 <= start and start + slots <= alloc.pool_tokens
        for slot in range(start, start + slots):
            assert owner[slot] is None, f"slot {slot} in two regions"
            owner[slot] = seq
    return owner


def _free_runs(owner: list[int | None]) -> list[tuple[int, int]]:
    """(start, length) of every maximal run of free slots, found slot by slot."""
    runs, start = [], None
    for slot, seq in enumerate([*owner, -1]):  # a sentinel owner closes the last run
        if seq is None and start is None:
            start = slot
        elif seq is not None and start is not None:
            runs.append((start, slot - start))
            start = None
    return runs


def _lowest_fit(owner: list[int | None], slots: int) -> int | None:
    """Brute-force first fit: the lowest address whose next ``slots`` slots are all free."""
    for a in range(len(owner) - slots + 1):
        if all(o is None for o in owner[a : a + slots]):
            return a
    return None


def _check(alloc: RegionAllocator, waiting_slots: int | None) -> None:
    owner = _owners(alloc)
    runs = _free_runs(owner)
    # The allocator's holes are exactly the free runs: every slot is in a region or a hole, once.
    assert alloc.holes() == runs
    u = alloc.usage()
    free = sum(length for _, length in runs)
    assert u.reserved_tokens == sum(slots for _, slots in alloc.region.values())
    assert u.used_tokens == sum(alloc.length.values()) == u.logical_tokens
    assert u.reserved_tokens == u.used_tokens + u.reservation_waste_tokens and u.fragmentation_tokens == 0
    assert u.pool_tokens == u.used_tokens + u.reservation_waste_tokens + u.free_tokens
    assert u.free_tokens == free == owner.count(None)
    want = 0 if waiting_slots is None else sum(length for _, length in runs if length < waiting_slots)
    assert u.external_fragmentation_tokens == want
    for seq, (start, slots) in alloc.region.items():
        n = alloc.num_tokens(seq)
        assert n <= slots and alloc.slots(seq, 0, n) == list(range(start, start + n))


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("admit"), st.integers(1, MAX_SEQ_LEN - 1), st.integers(1, MAX_SEQ_LEN), st.integers(1, 3)),
        st.tuples(st.just("append"), st.integers(0, 99), st.integers(1, 8)),
        st.tuples(st.just("release"), st.integers(0, 99)),
        st.tuples(st.just("wait"), st.integers(1, MAX_SEQ_LEN)),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(ops=OPS, capacity=st.integers(1, 160), policy=st.sampled_from(["pow2", "oracle"]))
def test_random_operations_match_a_slot_model(ops, capacity, policy):
    alloc = RegionAllocator(capacity, MAX_SEQ_LEN, RESERVATIONS[policy])
    live: list[int] = []
    next_id, waiting = 0, None
    for op in ops:
        if op[0] == "admit":
            _, prompt_len, output_len, samples = op
            final = min(prompt_len + output_len, MAX_SEQ_LEN)
            slots = alloc.reserved_slots(final)
            owner = _owners(alloc)
            # Brute force: where first fit puts the sequence and each fork, one after another.
            places = []
            for _ in range(samples):
                at = _lowest_fit(owner, slots)
                if at is None:
                    break
                places.append(at)
                owner[at : at + slots] = [-1] * slots
            prompt = list(range(prompt_len))
            fits = len(places) == samples
            plan = alloc.plan_admit(prompt, samples, final)
            assert plan.fits == fits and plan.region_slots == slots and plan.cached_tokens == 0
            if fits:
                assert alloc.admit(next_id, plan) == 0
                assert alloc.start(next_id) == places[0]
                parent, live = next_id, [*live, next_id]
                next_id += 1
                for at in places[1:]:
                    assert alloc.fork(parent, next_id) == [SlotCopy(places[0], at, prompt_len)]
                    assert alloc.start(next_id) == at
                    live.append(next_id)
                    next_id += 1
        elif op[0] == "append" and live:
            seq, k = live[op[1] % len(live)], op[2]
            room = alloc.region[seq][1] - alloc.num_tokens(seq)
            assert alloc.can_append(seq, k) == (k <= room)
            assert alloc.appendable_without_alloc(seq) == room
            if k <= room:
                assert alloc.append(seq, [7] * k) == []
        elif op[0] == "release" and live:
            alloc.release(live.pop(op[1] % len(live)))
        elif op[0] == "wait":
            waiting = op[1]
            alloc.note_waiting(waiting)
        _check(alloc, None if waiting is None else alloc.reserved_slots(waiting))
    for seq in live:
        alloc.release(seq)
    assert alloc.holes() == [(0, capacity)] and alloc.usage().free_tokens == capacity


def test_external_fragmentation_is_free_memory_split_below_the_next_request():
    """The paper's Figure 2/3 case: enough free slots in total, none of them in one piece."""
    alloc = RegionAllocator(10, 10, reserve_oracle)
    for seq, length in enumerate([4, 2, 4]):
        alloc.admit(seq, alloc.plan_admit([1], total_len=length))
    assert [alloc.start(s) for s in range(3)] == [0, 4, 6]
    alloc.release(0)
    alloc.release(2)
    assert alloc.holes() == [(0, 4), (6, 4)]
    alloc.note_waiting(5)  # 8 slots free, no 5 of them together
    assert not alloc.can_admit([1], total_len=5)
    assert alloc.usage().external_fragmentation_tokens == 8
    alloc.note_waiting(4)  # both holes hold a request of 4
    assert alloc.usage().external_fragmentation_tokens == 0
    alloc.note_waiting(None)  # nothing waits: nothing is stranded
    assert alloc.usage().external_fragmentation_tokens == 0
    alloc.release(1)  # the holes merge
    assert alloc.holes() == [(0, 10)]


def test_first_fit_takes_the_lowest_hole_that_holds_the_region():
    alloc = RegionAllocator(20, 20, reserve_oracle)
    for seq, length in enumerate([3, 2, 6, 2, 7]):
        alloc.admit(seq, alloc.plan_admit([1], total_len=length))
    alloc.release(0)  # hole [0, 3)
    alloc.release(2)  # hole [5, 11)
    alloc.admit(5, alloc.plan_admit([1], total_len=4))  # too big for [0, 3): the first hole that holds it
    assert alloc.start(5) == 5
    alloc.admit(6, alloc.plan_admit([1], total_len=3))
    assert alloc.start(6) == 0


@pytest.mark.parametrize(("final", "pow2"), [(1, 1), (2, 2), (3, 4), (64, 64), (65, 128), (500, 512), (1000, 1024)])
def test_pow2_reserves_the_next_power_of_two_capped_at_max_seq_len(final, pow2):
    assert reserve_pow2(final, 4096) == pow2
    assert reserve_pow2(final, 600) == min(pow2, max(final, 600))
    assert reserve_oracle(final, 4096) == final
    assert reserve_oracle(final, 4096) <= reserve_pow2(final, 4096) <= RESERVATIONS["max"](final, 4096)


def test_a_plan_is_stale_once_the_allocator_changes():
    """A plan holds the region size first fit would place now; any admit, append, fork or release voids it."""
    alloc = RegionAllocator(20, 20, reserve_oracle)
    first = alloc.plan_admit([1], total_len=4)
    second = alloc.plan_admit([1], total_len=4)
    alloc.admit(0, first)
    with pytest.raises(StalePlanError):
        alloc.admit(1, second)
    assert alloc.holes() == [(4, 16)]  # the refused admission took nothing
    for change in (lambda: alloc.append(0, [2]), lambda: alloc.fork(0, 1), lambda: alloc.release(1)):
        plan = alloc.plan_admit([1], total_len=4)
        change()
        with pytest.raises(StalePlanError):
            alloc.admit(2, plan)
    alloc.admit(2, alloc.plan_admit([1], total_len=4))
    assert alloc.start(2) == 4  # where the fork was
