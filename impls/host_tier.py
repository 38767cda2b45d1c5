"""A host-memory tier under the device's prefix cache (``device.host_kv_gb``): pure Python, no tensors.

When the block pool evicts a cached block (impls/block_manager.py ``_take_block``), its contents go
here instead of vanishing: the tier holds ``capacity`` blocks in host memory, keyed by the block's
chain hash and checked by its token ids, exactly as the device cache checks a hit. A later prompt
whose prefix runs past the device's hits finds the next blocks here; each such *host hit* takes a
device block and a copy back (host -> device) instead of a recompute.

Inside the tier the least recently stored or hit entry goes first. An entry stays after a copy back
(the host copy is still valid): when that device block is evicted again, nothing is copied.

The tier also queues the copies a step must do, as (device block, host slot) pairs: ``stores``
(device -> host, of evicted blocks) and ``loads`` (host -> device, of host hits). The step does the
stores first (an evicted device block is about to get new contents; stores read it before anything
writes it), then the loads. A host slot a queued load reads is *pinned* until the step takes the
queue (``take_copies``): a store in the same step never overwrites it.

Swap (``preemption=swap``) uses the same memory: a swapped-out sequence's blocks take slots that
are *reserved* (outside the cache's entries, so nothing evicts them) until it is swapped back in;
they are freed once that step's loads are taken.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Sequence


@dataclass(frozen=True)
class HostCopies:
    """One step's copies between the device pool and the host tier, in the order they must run."""

    stores: tuple[tuple[int, int], ...] = ()  # (device block, host slot): device -> host, first
    loads: tuple[tuple[int, int], ...] = ()  # (device block, host slot): host -> device, after the stores

    def __bool__(self) -> bool:
        return bool(self.stores or self.loads)

    @property
    def num_blocks(self) -> int:
        return len(self.stores) + len(self.loads)


NO_HOST_COPIES = HostCopies()


class HostTier:
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a host tier holds at least one block, got capacity={capacity}")
        self.capacity = capacity
        # chain hash -> (token ids, host slot), least recently stored or hit first
        self.entries: OrderedDict[int, tuple[tuple[int, ...], int]] = OrderedDict()
        # Free slots: the freed ones (popped from the end: the last freed first), then the never used ones,
        # fresh_slot .. capacity - 1 in order. Never used slots take no memory: a simulated tier of terabytes
        # (scenario=capacity) costs only the blocks the run stores (a list of every slot took 40 bytes each).
        self.free_slots: list[int] = []
        self.fresh_slot = 0
        self._pinned: set[int] = set()  # host slots a queued load reads
        self.reserved: set[int] = set()  # slots of swapped-out sequences
        self._free_after: list[int] = []  # reserved slots whose loads are queued: free once taken
        self._stores: list[tuple[int, int]] = []
        self._loads: list[tuple[int, int]] = []
        self.stored_blocks = 0  # blocks copied device -> host, over the run
        self.loaded_blocks = 0  # blocks copied host -> device, over the run
        self.dropped_blocks = 0  # entries the tier evicted (or could not take: every slot pinned)

    def __len__(self) -> int:
        return len(self.entries)

    def lookup(self, h: int, toks: tuple[int, ...]) -> int | None:
        """The host slot holding block (``h``, ``toks``), or None (a hash collision is a miss too)."""
        entry = self.entries.get(h)
        return entry[1] if entry is not None and entry[0] == toks else None

    def store(self, device_block: int, h: int, toks: tuple[int, ...]) -> None:
        """An evicted device block's contents: keep them, queuing the copy unless they are here already."""
        entry = self.entries.get(h)
        if entry is not None and entry[0] == toks:
            self.entries.move_to_end(h)  # the host copy is this block's contents: no copy
            return
        if entry is not None:  # a colliding hash: the new contents replace the old
            self._drop(h)
        slot = self._free_slot()
        if slot is None:
            self.dropped_blocks += 1  # every slot holds a block a queued load still reads
            return
        self.entries[h] = (toks, slot)
        self._stores.append((device_block, slot))
        self.stored_blocks += 1

    def load(self, device_block: int, h: int) -> None:
        """A host hit on ``h``: queue its copy into ``device_block``, pinning its slot for the step."""
        toks, slot = self.entries[h]
        self.entries.move_to_end(h)
        self._pinned.add(slot)
        self._loads.append((device_block, slot))
        self.loaded_blocks += 1

    def pin(self, h: int) -> None:
        """Keep ``h``'s slot through this step (an admission about to load it takes blocks first)."""
        self.entries.move_to_end(h)
        self._pinned.add(self.entries[h][1])

    def take_copies(self) -> HostCopies:
        """The copies queued since the last call, stores first; unpins every slot."""
        self._pinned.clear()
        if not (self._stores or self._loads):
            return NO_HOST_COPIES
        copies = HostCopies(tuple(self._stores), tuple(self._loads))
        self._stores, self._loads = [], []
        self.free_slots += self._free_after
        self._free_after = []
        return copies

    def swap_out(self, device_blocks: list[int]) -> list[int] | None:
        """Reserve a slot per block and queue their stores; None (nothing done) if the tier lacks room."""
        unpinned = sum(1 for _, slot in self.entries.values() if slot not in self._pinned)
        if len(device_blocks) > self.num_free_slots + unpinned:
            return None
        slots = [self._free_slot() for _ in device_blocks]
        self.reserved.update(slots)
        self._stores += zip(device_blocks, slots)
        self.stored_blocks += len(slots)
        return slots

    def swap_in(self, device_blocks: list[int], slots: list[int]) -> None:
        """Queue the loads of a swapped-out sequence's slots; they are free again once the step takes them."""
        self.reserved.difference_update(slots)
        self._pinned.update(slots)
        self._free_after += slots
        self._loads += zip(device_blocks, slots)
        self.loaded_blocks += len(slots)

    @property
    def num_free_slots(self) -> int:
        return len(self.free_slots) + self.capacity - self.fresh_slot

    def _free_slot(self) -> int | None:
        if self.free_slots:
            return self.free_slots.pop()
        if self.fresh_slot < self.capacity:
            self.fresh_slot += 1
            return self.fresh_slot - 1
        for h, (_, slot) in self.entries.items():  # least recent first; pinned ones are rare and recent
            if slot not in self._pinned:
                self._drop(h)
                return self.free_slots.pop()
        return None

    def _drop(self, h: int) -> None:
        _, slot = self.entries.pop(h)
        self.free_slots.append(slot)
        self.dropped_blocks += 1

    def check_invariants(self) -> None:
        free = self.free_slots + list(range(self.fresh_slot, self.capacity))
        slots = [slot for _, slot in self.entries.values()]
        assert len(set(slots)) == len(slots), "two host entries share a slot"
        assert not set(slots) & set(free), "a host slot is both held and free"
        slots += [*self.reserved, *self._free_after]
        assert len(set(slots)) == len(slots), "a host slot is held twice (cached, swapped, freed after the step)"
        assert not set(slots) & set(free), "a host slot is both held and free"
        assert len(slots) + len(free) == self.capacity, "host slots held + free != capacity"
        assert all(0 <= s < self.fresh_slot for s in slots + self.free_slots), "a slot handed out is not below fresh_slot"
        for _, slot in self._loads:
            assert slot in self._pinned and slot in slots, "a queued load reads a slot not held and pinned"


def host_prefix(tier: HostTier, token_ids, first: int, end: int, block_size: int, parent_hash: int,
                chain_hash: Callable[[int, tuple[int, ...]], int]) -> tuple[tuple[int, ...], int | None]:
    """Where the device's prefix hits end (full block ``first``, chained to ``parent_hash``): the chain
    hashes of the blocks ``first..end-1`` the tier holds in a row, and the hash of the first it lacks
    (None: it holds them all, or ``first == end``). A plan's host hits, as ``plan_admit`` looks them up;
    ``chain_hash`` is the device cache's (impls/prefix_chain.py): one chain over both tiers."""
    hits: list[int] = []
    h = parent_hash
    for i in range(first, end):
        toks = tuple(token_ids[i * block_size : (i + 1) * block_size])
        h = chain_hash(h, toks)
        if tier.lookup(h, toks) is None:
            return tuple(hits), h
        hits.append(h)
    return tuple(hits), None


class HostTierPool:
    """The block pool's side of the host tier and of swap: the part of impls/block_manager.py's
    ``BlockManager`` that only a tier uses, kept here so the pool's hot paths stay one attribute
    check (``self.host is not None``) away from it. Reads and writes the pool's own fields."""

    def _init_host(self, host_blocks: int, swap: bool) -> None:
        # Evicted cached blocks' contents go here, and swapped-out sequences' blocks (swap).
        self.host = HostTier(host_blocks) if host_blocks else None
        if swap and self.host is None:
            raise ValueError("swap needs a host tier (host_blocks > 0)")
        self.swap = swap
        self._swapped: dict[int, tuple[list[int], list[int]]] = {}  # seq -> (host slots, tokens)
        self.swapped_out = 0  # sequences preempted by swap, over the run
        self.host_hit_tokens = 0  # tokens served from the host tier (copied back), over the run

    def _load_host(self, hits: tuple[int, ...], token_ids: Sequence[int], table: list[int], fresh) -> int:
        """Host hits after ``table``'s device hits: a block each (``fresh``'s first, else taken now),
        registered, its copy back queued. Returns the last one's hash."""
        bs, host = self.block_size, self.host
        for h in hits:  # taking blocks may evict device blocks into the tier: it must keep these
            host.pin(h)
        for i, h in enumerate(hits):
            b = fresh.pop(0) if fresh is not None else self._take_block()
            self.filled[b] = bs
            self._register(b, h, tuple(token_ids[len(table) * bs : (len(table) + 1) * bs]))
            host.load(b, h)
            table.append(b)
        return hits[-1]

    def take_host_copies(self) -> HostCopies:
        """The device <-> host copies queued since the last call (stores first): the step does them."""
        return NO_HOST_COPIES if self.host is None else self.host.take_copies()

    # ---- swap (preemption=swap) ------------------------------------------------------------
    def swap_out(self, seq_id: int) -> bool:
        """Preempt by swap: every block's contents to the host tier, then release the sequence.
        False, nothing done, unless this pool swaps and its tier has room (then: recompute)."""
        slots = self.host.swap_out(self.tables[seq_id]) if self.swap else None
        if slots is None:
            return False
        self._swapped[seq_id] = (slots, self.tokens[seq_id])
        self.release(seq_id)
        self.swapped_out += 1
        return True

    def can_swap_in(self, seq_id: int, watermark: bool = True) -> bool:
        return len(self._swapped[seq_id][0]) + self.watermark_blocks * watermark <= self.num_free_blocks

    def swap_in(self, seq_id: int) -> None:
        """Its blocks back from the host tier, as they were (uncached: they join no prefix chain)."""
        slots, toks = self._swapped.pop(seq_id)
        table = [self._take_block() for _ in slots]
        for i, b in enumerate(table):
            self.filled[b] = min(self.block_size, len(toks) - i * self.block_size)
        self.host.swap_in(table, slots)
        self.tables[seq_id], self.tokens[seq_id], self._changed[seq_id] = table, toks, 0
        self._logical += len(toks)
        self._filled_in_use += len(toks)
        self.generation += 1

    def host_counters(self) -> dict[str, int]:
        """The host tier's counts over the run, as row columns (none without a tier)."""
        h = self.host
        return {} if h is None else {"host_hit_tokens": self.host_hit_tokens, "host_stored_blocks": h.stored_blocks,
                                     "host_loaded_blocks": h.loaded_blocks, "swapped_out": self.swapped_out}

    def _check_host_invariants(self) -> None:
        if self.host is not None:
            self.host.check_invariants()
            assert sum(len(slots) for slots, _ in self._swapped.values()) == len(self.host.reserved)
            assert not set(self._swapped) & set(self.tables), "a swapped-out sequence holds device blocks"
