"""The event-driven simulator's calendar (harness/serving/simulator.py): each riding sequence's lazy state and
the token it "generates", and sequences by the step of their next event."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Optional

from kvbench.harness.serving.sequence import Sequence


def synthetic_token(seq: Sequence, vocab: int) -> int:
    """The token a sequence "generates" (one per sequence: only memory is simulated)."""
    return (seq.request_id * 1_000_003 + seq.sample * 7_919) % vocab


@dataclass(slots=True)
class Track:
    """A running sequence's lazy state; step numbers count decode steps from the start."""

    synced: int  # its tokens are in the allocator (and output_ids) up to this step
    due: int  # the step whose token needs memory
    finish: int  # the step that makes its last token
    token: int
    base: int  # the allocator's tokens of it less ``synced`` (constant, but inside a step's planning)


class Calendar:
    """Sequences by the step of their next event; the earliest step in O(log n)."""

    def __init__(self) -> None:
        self._at: dict[int, dict[Sequence, None]] = {}
        self._keys: list[int] = []

    def add(self, step: int, seq: Sequence) -> None:
        bucket = self._at.get(step)
        if bucket is None:
            self._at[step] = bucket = {}
            heapq.heappush(self._keys, step)
        bucket[seq] = None

    def discard(self, step: int, seq: Sequence) -> None:
        bucket = self._at.get(step)
        if bucket is not None:
            bucket.pop(seq, None)
            if not bucket:
                del self._at[step]

    def at(self, step: int) -> list[Sequence]:
        return list(self._at.get(step, ()))

    def clear(self, step: int) -> None:
        self._at.pop(step, None)

    def first(self) -> Optional[int]:
        while self._keys and self._keys[0] not in self._at:
            heapq.heappop(self._keys)
        return self._keys[0] if self._keys else None
