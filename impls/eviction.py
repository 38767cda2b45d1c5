"""Which cached free block a prefix cache gives up first: the eviction policies (``impl.eviction``).

A paged cache keeps a freed full block's contents while nothing needs its memory, so a later prompt
with the same prefix finds it (a prefix hit). When a block must be taken and the never-cached free
list is empty, one of these cached free ("evictable") blocks loses its contents. Which one decides
how much reuse the cache keeps. Every policy here holds only the evictable blocks (reference count
0, contents cached); the block manager tells it:

- ``add(b)``: ``b`` became evictable (its last sequence released it; a sequence's tail blocks first);
- ``remove(b)``: a prefix hit revived ``b`` (it is in use again);
- ``hit(b)``: a prefix hit on ``b``, in use or not (what frequency-aware policies count);
- ``pop()``: take the victim out, and forget its history (its contents are gone);
- ``forget(b)``: ``b`` (in use) was given new contents, so its history is another block's.

Policies:

- ``lru``: least recently freed first. Today's behaviour, and vLLM's and SGLang's.
- ``lfu``: fewest hits first, aged (LFU with dynamic aging, as in Arlitt et al.'s web-cache studies):
  a block's priority is its hits plus the priority of the last victim when it was freed, so a block
  hit often long ago does not stay forever. Ties: least recently freed first.
- ``2q``: scan resistant (after Johnson & Shasha's 2Q and segmented LRU). Blocks never hit since their
  contents were written wait in a probation FIFO and go first; blocks hit at least once are protected,
  in LRU order, up to ``PROTECTED_SHARE`` of the pool's blocks; over it, the protected LRU block is
  moved to probation's tail. A burst of one-off prompts then cannot flush a reused system prompt.

All are O(1) or O(log n) per call, in plain Python, so the capacity scenario runs them at 70B scale.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from typing import Iterator, Protocol

POLICIES = ("lru", "lfu", "2q")
PROTECTED_SHARE = 0.75  # 2q: the protected segment's largest share of the pool's blocks


class EvictionPolicy(Protocol):
    name: str

    def add(self, b: int) -> None: ...
    def remove(self, b: int) -> None: ...
    def hit(self, b: int) -> None: ...
    def pop(self) -> int: ...
    def forget(self, b: int) -> None: ...
    def __len__(self) -> int: ...
    def __contains__(self, b: int) -> bool: ...
    def __iter__(self) -> Iterator[int]: ...


class LRU:
    name = "lru"

    def __init__(self) -> None:
        self.order: OrderedDict[int, None] = OrderedDict()  # least recently freed first

    def add(self, b: int) -> None:
        self.order[b] = None

    def remove(self, b: int) -> None:
        del self.order[b]

    def hit(self, b: int) -> None:
        pass  # recency is the time a block was freed: a hit revives it, and its release re-adds it

    def pop(self) -> int:
        return self.order.popitem(last=False)[0]

    def forget(self, b: int) -> None:
        pass

    def __len__(self) -> int:
        return len(self.order)

    def __contains__(self, b: int) -> bool:
        return b in self.order

    def __iter__(self) -> Iterator[int]:
        return iter(self.order)


class LFU:
    name = "lfu"

    def __init__(self) -> None:
        self.hits: dict[int, int] = {}  # since the block's contents were written
        self.entry: dict[int, int] = {}  # evictable block -> its live heap entry's sequence number
        self.heap: list[tuple[int, int, int]] = []  # (priority, sequence number, block); stale entries skipped
        self.age = 0  # the last victim's priority (dynamic aging)
        self._seq = 0

    def add(self, b: int) -> None:
        self._seq += 1
        self.entry[b] = self._seq
        heapq.heappush(self.heap, (self.hits.get(b, 0) + self.age, self._seq, b))

    def remove(self, b: int) -> None:
        del self.entry[b]  # its heap entry is stale from now on

    def hit(self, b: int) -> None:
        self.hits[b] = self.hits.get(b, 0) + 1

    def pop(self) -> int:
        while True:
            priority, seq, b = heapq.heappop(self.heap)
            if self.entry.get(b) == seq:
                del self.entry[b]
                self.hits.pop(b, None)
                self.age = priority
                if len(self.heap) > 4 * len(self.entry) + 64:  # stale entries: rebuild, never let them pile up
                    self.heap = [e for e in self.heap if self.entry.get(e[2]) == e[1]]
                    heapq.heapify(self.heap)
                return b

    def forget(self, b: int) -> None:
        self.hits.pop(b, None)

    def __len__(self) -> int:
        return len(self.entry)

    def __contains__(self, b: int) -> bool:
        return b in self.entry

    def __iter__(self) -> Iterator[int]:
        return iter(self.entry)


class TwoQ:
    name = "2q"

    def __init__(self, num_blocks: int) -> None:
        self.cap = max(1, int(PROTECTED_SHARE * num_blocks))
        self.hits: dict[int, int] = {}
        self.probation: OrderedDict[int, None] = OrderedDict()  # never hit: FIFO, first out
        self.protected: OrderedDict[int, None] = OrderedDict()  # hit at least once: LRU

    def add(self, b: int) -> None:
        (self.protected if self.hits.get(b, 0) else self.probation)[b] = None
        while len(self.protected) > self.cap:
            demoted, _ = self.protected.popitem(last=False)
            self.probation[demoted] = None

    def remove(self, b: int) -> None:
        if b in self.probation:
            del self.probation[b]
        else:
            del self.protected[b]

    def hit(self, b: int) -> None:
        self.hits[b] = self.hits.get(b, 0) + 1

    def pop(self) -> int:
        segment = self.probation if self.probation else self.protected
        b, _ = segment.popitem(last=False)
        self.hits.pop(b, None)
        return b

    def forget(self, b: int) -> None:
        self.hits.pop(b, None)

    def __len__(self) -> int:
        return len(self.probation) + len(self.protected)

    def __contains__(self, b: int) -> bool:
        return b in self.probation or b in self.protected

    def __iter__(self) -> Iterator[int]:
        yield from self.probation
        yield from self.protected


def eviction_policy(name: str, num_blocks: int) -> EvictionPolicy:
    """The policy ``name`` over a pool of ``num_blocks`` blocks."""
    if name == "lru":
        return LRU()
    if name == "lfu":
        return LFU()
    if name == "2q":
        return TwoQ(num_blocks)
    raise ValueError(f"impl.eviction={name!r}: choose one of {', '.join(POLICIES)}")
