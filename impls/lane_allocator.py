"""Contiguous KV bookkeeping: one lane of ``max_seq_len`` token slots reserved per sequence up front.

This is the baseline the PagedAttention paper and the seeds describe: a sequence
owns a whole lane from admission to release, whatever its real length, and a fork
(parallel sampling) needs a lane of its own plus a copy of the parent's tokens.

The slab is ``[lanes, max_seq_len, kv_heads, head_dim]``: a sequence's *lane* is its
run of ``max_seq_len`` token slots (``lane(seq_id)`` its index); ``slots(seq_id, start,
end)`` gives its tokens' flat slots, as every allocator does.
"""

from __future__ import annotations

from typing import Sequence

from kvbench.impls.allocator import AdmitPlan, CacheUsage, SlotCopy
from kvbench.impls.fast_path import FastPath


class LaneAllocator(FastPath):
    padded_decode_read = True  # ContiguousCache attends over lanes[:, :longest], masked

    def __init__(self, num_lanes: int, max_seq_len: int) -> None:
        if num_lanes < 1:
            raise ValueError(f"num_lanes must be >= 1, got {num_lanes}")
        self.num_lanes = num_lanes
        self.max_seq_len = max_seq_len
        self.free: list[int] = list(range(num_lanes - 1, -1, -1))  # pop() hands out lane 0 first
        self.lane_of: dict[int, int] = {}
        self.length: dict[int, int] = {}
        self._tokens = 0
        self.generation = 0

    def lane(self, seq_id: int) -> int:
        return self.lane_of[seq_id]

    def num_tokens(self, seq_id: int) -> int:
        return self.length[seq_id]

    def plan_admit(self, token_ids: Sequence[int], num_samples: int = 1, total_len: int | None = None) -> AdmitPlan:
        fits = len(token_ids) <= self.max_seq_len and len(self.free) >= num_samples  # a lane per sample
        return AdmitPlan(token_ids, num_samples, total_len, cached_tokens=0, fits=fits, generation=self.generation)

    def admit(self, seq_id: int, plan: AdmitPlan) -> int:
        self._check_plan(plan)
        assert seq_id not in self.lane_of, f"sequence {seq_id} admitted twice"
        n = len(plan.token_ids)
        self.lane_of[seq_id] = self.free.pop()
        self.length[seq_id] = n
        self._tokens += n
        self.generation += 1
        return 0

    def can_append(self, seq_id: int, num_tokens: int = 1) -> bool:
        return self.length[seq_id] + num_tokens <= self.max_seq_len

    def append(self, seq_id: int, token_ids: Sequence[int]) -> list[SlotCopy]:
        assert self.can_append(seq_id, len(token_ids)), f"sequence {seq_id} exceeds max_seq_len"
        self.length[seq_id] += len(token_ids)
        self._tokens += len(token_ids)
        self.generation += 1
        return []

    def fork(self, parent_id: int, child_id: int) -> list[SlotCopy]:
        lane = self.free.pop()
        n = self.length[parent_id]
        self.lane_of[child_id] = lane
        self.length[child_id] = n
        self._tokens += n
        self.generation += 1
        return [SlotCopy(self.lane_of[parent_id] * self.max_seq_len, lane * self.max_seq_len, n)]

    def release(self, seq_id: int) -> None:
        self.free.append(self.lane_of.pop(seq_id))
        self._tokens -= self.length.pop(seq_id)
        self.generation += 1

    def slots(self, seq_id: int, start: int, end: int) -> list[int]:
        base = self.lane_of[seq_id] * self.max_seq_len
        return list(range(base + start, base + end))

    def max_sequence_tokens(self) -> int:
        return self.max_seq_len  # one lane each, however many lanes the pool has

    def appendable_without_alloc(self, seq_id: int) -> int:
        return self.max_seq_len - self.length[seq_id]  # the lane was reserved whole at admission

    def usage(self) -> CacheUsage:
        reserved = len(self.lane_of) * self.max_seq_len
        return CacheUsage(
            pool_tokens=self.num_lanes * self.max_seq_len,
            reserved_tokens=reserved,
            used_tokens=self._tokens,
            logical_tokens=self._tokens,
            fragmentation_tokens=0,
            reservation_waste_tokens=reserved - self._tokens,
            num_sequences=len(self.lane_of),
            free_tokens=len(self.free) * self.max_seq_len,
        )
