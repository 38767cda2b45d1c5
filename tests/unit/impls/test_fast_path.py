"""The narrow allocator interface and the simulator's fast path beside it (impls/fast_path.py)."""

from __future__ import annotations

from kvbench.impls.allocator import KVAllocator
from kvbench.impls.block_manager import BlockManager
from kvbench.impls.fast_path import FastPath, StepByStep, fast_path
from kvbench.impls.lane_allocator import LaneAllocator
from kvbench.impls.region_allocator import RegionAllocator

NARROW = {"plan_admit", "admit", "can_append", "append", "fork", "release", "slots", "num_tokens", "usage"}


def test_a_cache_kind_implements_a_handful_of_methods():
    assert KVAllocator.__abstractmethods__ == NARROW
    assert FastPath.__abstractmethods__ == NARROW | {"appendable_without_alloc"}
    assert not {"riding_steps", "fill_is_silent", "usage_plus_written", "on_expose"} & set(vars(KVAllocator))


def test_every_allocator_keeps_its_fast_path():
    assert all(issubclass(kind, FastPath) for kind in (BlockManager, LaneAllocator, RegionAllocator))
    alloc = BlockManager(8, 4)
    assert fast_path(alloc) is alloc


def test_the_default_fast_path_rides_to_the_next_allocation():
    lanes = LaneAllocator(2, 16)
    lanes.admit(0, lanes.plan_admit([1, 2, 3]))
    assert lanes.appendable_without_alloc(0) == 13 == lanes.riding_steps(0)  # a fill is an event: no blocks
    u, plus = lanes.usage(), lanes.usage_plus_written(5)
    assert (plus.used_tokens, plus.logical_tokens) == (u.used_tokens + 5, u.logical_tokens + 5)
    assert plus.reservation_waste_tokens == u.reservation_waste_tokens - 5 and plus.reserved_tokens == u.reserved_tokens


def test_without_a_fast_path_every_sequence_is_due_every_step():
    class Narrow(KVAllocator):  # the narrow interface alone, with LaneAllocator's answers
        plan_admit, admit, can_append, append = (LaneAllocator.plan_admit, LaneAllocator.admit,
                                                 LaneAllocator.can_append, LaneAllocator.append)
        fork, release, slots, num_tokens, usage = (LaneAllocator.fork, LaneAllocator.release,
                                                   LaneAllocator.slots, LaneAllocator.num_tokens, LaneAllocator.usage)
        __init__ = LaneAllocator.__init__

    assert Narrow.__mro__[1] is KVAllocator
    alloc = Narrow(2, 16)
    alloc.admit(0, alloc.plan_admit([1, 2, 3]))
    ride = fast_path(alloc)
    assert isinstance(ride, StepByStep) and not isinstance(alloc, FastPath)
    assert (ride.riding_steps(0), ride.appendable_without_alloc(0)) == (1, 0)
    assert ride.usage_plus_written(0) == alloc.usage()
