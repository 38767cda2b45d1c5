"""Variable-size contiguous KV regions in one buffer of token slots, placed first-fit.

The bookkeeping of the paper's Orca (Pow2) and Orca (Oracle) baselines: at admission a
sequence reserves one contiguous region, sized by a reservation policy
(impls/reservation.py) from its final length, and keeps it until release.

Placement is **first-fit**: a region goes at the lowest address of the first hole (in
address order) that holds it, and a freed region merges with the holes beside it. The
holes are a sorted list of starts plus their lengths; there are at most one more of them
than live regions, so a scan is cheap.

Regions of different sizes leave holes of different sizes: **external fragmentation**, the
third waste of the paper's Figure 2. At a snapshot it is *the free slots in holes smaller
than the reservation of the request first in the waiting queue*: free memory that request
cannot use because it is split (every slot of a large enough hole could still go to it).
It is 0 when nothing waits. The scheduler names that request after each step
(``note_waiting``), so the figure needs only this state and the queue's head.

Accounting, like the ``max`` lane allocator's: a region's slots hold token states or are
reservation waste (reserved, not yet written); every other slot is free.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Sequence

from kvbench.impls.allocator import AdmitPlan, CacheUsage, SlotCopy
from kvbench.impls.fast_path import FastPath
from kvbench.impls.reservation import Reservation


@dataclass(frozen=True)
class RegionAdmitPlan(AdmitPlan):
    """An admission of one region: its size, from the reservation policy."""

    region_slots: int


class RegionAllocator(FastPath):
    padded_decode_read = True  # RegionCache gathers every region to the batch's longest, masked

    def __init__(self, pool_tokens: int, max_seq_len: int, reservation: Reservation) -> None:
        if pool_tokens < 1:
            raise ValueError(f"pool_tokens must be >= 1, got {pool_tokens}")
        self.pool_tokens = pool_tokens
        self.max_seq_len = max_seq_len
        self.reservation = reservation
        self.hole_starts: list[int] = [0]  # sorted; never two adjacent holes (they merge)
        self.hole_len: dict[int, int] = {0: pool_tokens}
        self.region: dict[int, tuple[int, int]] = {}  # seq_id -> (start, slots)
        self.length: dict[int, int] = {}
        self._tokens = 0
        self._reserved = 0
        self._waiting_slots: int | None = None  # reservation of the first waiting request
        self.generation = 0

    # ---- policy and placement ----------------------------------------------------
    def reserved_slots(self, total_len: int | None) -> int:
        if total_len is None:
            raise ValueError("a variable-size reservation needs the sequence's total_len (prompt + output)")
        return self.reservation(total_len, self.max_seq_len)

    def first_fit(self, slots: int) -> int | None:
        """Start of the first hole (in address order) that holds ``slots``; None if none does."""
        for start in self.hole_starts:
            if self.hole_len[start] >= slots:
                return start
        return None

    def _take(self, slots: int) -> int:
        start = self.first_fit(slots)
        assert start is not None, "no hole holds the region: admit() or fork() without can_admit()"
        i = bisect_left(self.hole_starts, start)
        rest = self.hole_len.pop(start) - slots
        if rest:  # the hole's tail stays a hole, at the same place in address order
            self.hole_starts[i] = start + slots
            self.hole_len[start + slots] = rest
        else:
            del self.hole_starts[i]
        self._reserved += slots
        return start

    def _give(self, start: int, slots: int) -> None:
        i = bisect_left(self.hole_starts, start)
        end = start + slots
        if i < len(self.hole_starts) and self.hole_starts[i] == end:  # merge with the hole after
            slots += self.hole_len.pop(end)
            del self.hole_starts[i]
        if i > 0 and (prev := self.hole_starts[i - 1]) + self.hole_len[prev] == start:  # and the one before
            self.hole_len[prev] += slots
        else:
            self.hole_starts.insert(i, start)
            self.hole_len[start] = slots
        self._reserved -= end - start

    def holes(self) -> list[tuple[int, int]]:
        """(start, slots) of every free hole, in address order."""
        return [(s, self.hole_len[s]) for s in self.hole_starts]

    def start(self, seq_id: int) -> int:
        """First flat slot of the sequence's region."""
        return self.region[seq_id][0]

    # ---- the KVAllocator interface ---------------------------------------------------
    def num_tokens(self, seq_id: int) -> int:
        return self.length[seq_id]

    def plan_admit(self, token_ids: Sequence[int], num_samples: int = 1,
                   total_len: int | None = None) -> RegionAdmitPlan:
        slots = self.reserved_slots(total_len)
        return RegionAdmitPlan(token_ids, num_samples, total_len, cached_tokens=0,
                               fits=len(token_ids) <= slots and self._places(slots, num_samples),
                               generation=self.generation, region_slots=slots)

    def _places(self, slots: int, count: int) -> bool:
        """Whether ``count`` regions of ``slots`` go first-fit into the holes (on a copy of their sizes)."""
        sizes = [self.hole_len[s] for s in self.hole_starts]
        for _ in range(count):
            i = next((i for i, size in enumerate(sizes) if size >= slots), None)
            if i is None:
                return False
            sizes[i] -= slots
        return True

    def admit(self, seq_id: int, plan: RegionAdmitPlan) -> int:
        self._check_plan(plan)
        assert seq_id not in self.region, f"sequence {seq_id} admitted twice"
        n = len(plan.token_ids)
        self.region[seq_id] = (self._take(plan.region_slots), plan.region_slots)
        self.length[seq_id] = n
        self._tokens += n
        self.generation += 1
        return 0

    def can_append(self, seq_id: int, num_tokens: int = 1) -> bool:
        return self.length[seq_id] + num_tokens <= self.region[seq_id][1]

    def append(self, seq_id: int, token_ids: Sequence[int]) -> list[SlotCopy]:
        assert self.can_append(seq_id, len(token_ids)), f"sequence {seq_id} outgrows its reservation"
        self.length[seq_id] += len(token_ids)
        self._tokens += len(token_ids)
        self.generation += 1
        return []

    def fork(self, parent_id: int, child_id: int) -> list[SlotCopy]:
        parent, slots = self.region[parent_id]
        child = self._take(slots)  # same final length, same reservation
        n = self.length[parent_id]
        self.region[child_id] = (child, slots)
        self.length[child_id] = n
        self._tokens += n
        self.generation += 1
        return [SlotCopy(parent, child, n)]

    def release(self, seq_id: int) -> None:
        self._give(*self.region.pop(seq_id))
        self._tokens -= self.length.pop(seq_id)
        self.generation += 1

    def slots(self, seq_id: int, start: int, end: int) -> list[int]:
        base = self.region[seq_id][0]
        return list(range(base + start, base + end))

    def max_sequence_tokens(self) -> int:
        return min(self.pool_tokens, self.max_seq_len)  # no region is longer than max_seq_len

    def appendable_without_alloc(self, seq_id: int) -> int:
        return self.region[seq_id][1] - self.length[seq_id]  # the region was reserved whole at admission

    def note_waiting(self, total_len: int | None) -> None:
        self._waiting_slots = None if total_len is None else self.reserved_slots(total_len)

    def external_fragmentation(self, slots: int | None) -> int:
        """Free slots in holes smaller than ``slots`` (a waiting request's reservation); 0 for None."""
        if slots is None:
            return 0
        return sum(size for size in self.hole_len.values() if size < slots)

    def usage(self) -> CacheUsage:
        return CacheUsage(
            pool_tokens=self.pool_tokens,
            reserved_tokens=self._reserved,
            used_tokens=self._tokens,
            logical_tokens=self._tokens,
            fragmentation_tokens=0,
            reservation_waste_tokens=self._reserved - self._tokens,
            num_sequences=len(self.region),
            free_tokens=self.pool_tokens - self._reserved,
            external_fragmentation_tokens=self.external_fragmentation(self._waiting_slots),
        )
