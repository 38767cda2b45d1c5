"""Paged KV bookkeeping in pure Python: the block pool PagedAttention describes.

A pool of ``num_blocks`` blocks of ``block_size`` token slots; per-sequence block
tables (logical block -> physical block); per-block reference counts; blocks are
allocated only as tokens arrive. ``fork`` shares every block (parallel sampling);
appending into a shared, partly filled block copies it first (copy-on-write).
Full blocks are hashed by chain (parent hash, token ids) so a later request with
the same prefix reuses them; freed blocks keep their hash and stay reusable until
evicted, by the pool's eviction policy (impls/eviction.py; least recently freed first by
default), when the pool needs space.

The pool's parts, one module each: admission and prefix hits (impls/block_admission.py), growth and
copy-on-write (impls/block_growth.py), the prefix cache's chain hashes, lazily made
(impls/prefix_chain.py), and the host tier and swap (impls/host_tier.py). Here: the pool's state,
its free and evictable blocks, fork, release and the accounting.

Counters (filled slots, logical tokens) are kept incrementally so ``usage`` is
O(1): the capacity scenario calls it after every event at 70B scale.

``table_changes`` reports which table entries changed since it was last called, so
a device-side copy of the tables (impls/device_block_tables.py) applies only those.
"""

from __future__ import annotations

from collections import deque

from kvbench.impls.allocator import CacheUsage, SlotCopy, frozen_instance
from kvbench.impls.block_admission import BlockAdmission
from kvbench.impls.block_growth import BlockGrowth
from kvbench.impls.eviction import LRU, eviction_policy
from kvbench.impls.fast_path import FastPath
from kvbench.impls.host_tier import HostTierPool
from kvbench.impls.prefix_chain import PrefixChains, _Family
from kvbench.impls.sizing import blocks_for_tokens

class BlockManager(BlockAdmission, BlockGrowth, PrefixChains, HostTierPool, FastPath):
    """The paged pool: its state and life cycle here; admission (impls/block_admission.py), growth
    (impls/block_growth.py), the prefix cache (impls/prefix_chain.py) and the host tier
    (impls/host_tier.py) are its parts by concept."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        prefix_caching: bool = True,
        watermark_blocks: int = 0,
        eviction: str = "lru",
        host_blocks: int = 0,
        swap: bool = False,
    ) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1 or block_size & (block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.watermark_blocks = watermark_blocks
        self.ref = [0] * num_blocks
        self.filled = [0] * num_blocks  # slots written in each block
        # Each block's chain hash (None: none; a _Family: registered, pending) and tokens (hashed blocks), and
        # the cached block of each hash. Read them through the properties of impls/prefix_chain.py, which
        # hash what is pending.
        self._block_hash: list[int | _Family | None] = [None] * num_blocks
        self._block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self._hash_to_block: dict[int, int] = {}
        self.free: deque[int] = deque(range(num_blocks))  # never-cached free blocks
        self.evictable = eviction_policy(eviction, num_blocks)  # cached, refcount 0: the policy's order
        # Policies other than lru count each block's hits since its contents were written.
        self._history = eviction != "lru"
        # lru's order itself (an OrderedDict, least recently freed first), which the hot paths below use
        # directly instead of calling the policy (impls/eviction.py LRU: add, remove, pop are these).
        self._lru = self.evictable.order if type(self.evictable) is LRU else None
        self.tables: dict[int, list[int]] = {}
        self.tokens: dict[int, list[int]] = {}
        # seq -> first table entry changed since table_changes() last ran (0: the whole table)
        self._changed: dict[int, int] = {}
        self._filled_in_use = 0
        self._logical = 0
        self.cache_hit_tokens = 0  # tokens served from the prefix cache, over the run
        self.evicted_blocks = 0  # cached blocks whose contents were dropped to reuse the block, over the run
        self._init_host(host_blocks, swap)  # the host tier and swap (impls/host_tier.py HostTierPool)
        self.generation = 0
        # Lazy hashing (see _Family): with prefix caching, and without a host tier (which stores each
        # evicted block under its hash). Tests set it False to compare with eager hashing.
        self._lazy = prefix_caching and self.host is None
        self._root_family: dict[int, _Family] = {}  # root block -> its family, while that one is pending
        self._family: dict[int, _Family] = {}  # running sequence -> its pending family
        self._seen_roots: set[int] = set()  # every hash a first block was ever registered under

    # ---- derived sizes -------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free) + (len(self._lru) if self._lru is not None else len(self.evictable))

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def block_table(self, seq_id: int) -> list[int]:
        return self.tables[seq_id]

    def num_tokens(self, seq_id: int) -> int:
        return len(self.tokens[seq_id])

    def table_changes(self) -> dict[int, int]:
        """Tables changed since the previous call: sequence -> index of its first changed entry.

        An appended block or a copy-on-write replacement reports its own index; a new,
        forked or re-admitted sequence reports 0 (its whole table). Released sequences
        are not listed. Entries before the reported index are as they were.
        """
        changed, self._changed = self._changed, {}
        return changed

    def _mark_changed(self, seq_id: int, index: int) -> None:
        if index < self._changed.get(seq_id, index + 1):
            self._changed[seq_id] = index

    # ---- block pool -----------------------------------------------------
    def _take_block(self) -> int:
        if self.free:
            b = self.free.popleft()
            if self._history:
                self.evictable.forget(b)  # new contents: an earlier tenant's hits are not its own
        else:
            b = self._evict()
        ref = self.ref
        assert ref[b] == 0
        ref[b] = 1
        self.filled[b] = 0
        return b

    def _evict(self) -> int:
        """The eviction policy's victim, its contents dropped (to the host tier, if any): a block to reuse."""
        b = self._lru.popitem(False)[0] if self._lru is not None else self.evictable.pop()  # it forgets the history
        self.evicted_blocks += 1
        h = self._block_hash[b]
        if h.__class__ is _Family:  # pending: in no lookup table
            h.pending -= 1
        else:
            if self.host is not None:
                self.host.store(b, h, self._block_tokens[b])  # read before anything writes the block
            if b in self._root_family:  # the chain's first block leaves: hash the rest while it is known
                self._flush(self._root_family[b])
            cached = self._hash_to_block
            if cached.get(h) == b:  # an evictable block is the one its hash names (check_invariants)
                del cached[h]
        self._block_hash[b] = self._block_tokens[b] = None
        return b

    def _take_blocks(self, count: int) -> list[int]:
        """``count`` never-cached free blocks (there must be as many), as ``_take_block`` takes them."""
        free, ref, filled = self.free, self.ref, self.filled
        taken = [free.popleft() for _ in range(count)]
        if self._history:
            for b in taken:
                self.evictable.forget(b)
        for b in taken:
            assert ref[b] == 0
            ref[b] = 1
            filled[b] = 0
        return taken

    def fork(self, parent_id: int, child_id: int) -> list[SlotCopy]:
        assert child_id not in self.tables, f"sequence {child_id} exists"
        if parent_id in self._family:  # a shared chain is hashed eagerly
            self._flush(self._family[parent_id])
        table = list(self.tables[parent_id])
        for b in table:
            self.ref[b] += 1
        self.tables[child_id] = table
        self.tokens[child_id] = list(self.tokens[parent_id])
        self._changed[child_id] = 0
        self._logical += len(self.tokens[child_id])
        self.generation += 1
        return []

    def release(self, seq_id: int) -> None:
        table = self.tables.pop(seq_id)
        self.generation += 1
        self._changed.pop(seq_id, None)
        self._logical -= len(self.tokens.pop(seq_id))
        self._family.pop(seq_id, None)  # its pending blocks stay pending (and cached) in the family
        ref, filled, block_hash, block_tokens, cached = (self.ref, self.filled, self._block_hash, self._block_tokens,
                                                         self._hash_to_block)
        lru, add, free = self._lru, self.evictable.add, self.free
        freed = 0
        for b in reversed(table):  # tail blocks become the first to be evicted
            r = ref[b] - 1
            assert r >= 0, f"block {b} freed twice"
            ref[b] = r
            if r:
                continue
            freed += filled[b]
            h = block_hash[b]
            if h is not None and (h.__class__ is _Family or cached.get(h) == b):  # keep it for a later prefix hit
                if lru is not None:
                    lru[b] = None
                else:
                    add(b)
            else:  # _forget_hash, inlined: a block not cached under its hash leaves no entry to delete
                block_hash[b] = block_tokens[b] = None
                free.append(b)
        self._filled_in_use -= freed

    def drop_unwritten(self, seq_id: int, written: int) -> None:
        """Blocks from the first not fully written one on, held by ``seq_id`` alone, leave the prefix
        cache (call before ``release``). A block another sequence holds stays: that one writes it
        (harness/serving/scheduler.py starts a prefill sharing it at the writer's frontier)."""
        table, ref = self.tables[seq_id], self.ref
        for b in table[written // self.block_size:]:
            if ref[b] == 1 and self._block_hash[b] is not None:
                self._forget_hash(b)

    # ---- addressing and accounting ----------------------------------------
    def slots(self, seq_id: int, start: int, end: int) -> list[int]:
        bs, table = self.block_size, self.tables[seq_id]
        return [table[p // bs] * bs + p % bs for p in range(start, end)]

    def usage(self) -> CacheUsage:
        return self.usage_plus_written(0)

    def usage_plus_written(self, num_tokens: int) -> CacheUsage:
        """Tokens appended without allocation fill slots of owned, partly filled last blocks:
        each is one more used slot and one slot less of fragmentation."""
        bs = self.block_size
        free = self.num_free_blocks * bs
        pool = self.num_blocks * bs
        reserved = pool - free
        filled = self._filled_in_use + num_tokens
        return frozen_instance(CacheUsage, {
            "pool_tokens": pool, "reserved_tokens": reserved, "used_tokens": filled,
            "logical_tokens": self._logical + num_tokens, "fragmentation_tokens": reserved - filled,
            "reservation_waste_tokens": 0, "num_sequences": len(self.tables), "free_tokens": free,
            "external_fragmentation_tokens": 0})

    def check_invariants(self) -> None:
        """Assert the pool's invariants (tests call this after every operation)."""
        holders = [0] * self.num_blocks
        for table in self.tables.values():
            for b in table:
                holders[b] += 1
        assert holders == self.ref, "refcounts differ from the number of tables holding each block"
        free = list(self.free)
        assert len(set(free)) == len(free), "a block is on the free list twice"
        assert not set(free) & set(self.evictable), "a block is both free and cached-free"
        in_use = sum(1 for r in self.ref if r > 0)
        assert in_use + len(free) + len(self.evictable) == self.num_blocks, "free + in use != total"
        for b in free:
            assert self.ref[b] == 0 and self._block_hash[b] is None
        for b in self.evictable:
            h = self._block_hash[b]
            assert self.ref[b] == 0 and (self._hash_to_block.get(h) == b or self._root_family.get(
                getattr(h, "root", None)) is h)
        for h, b in self._hash_to_block.items():
            assert self._block_hash[b] == h and self.filled[b] == self.block_size
        # Pending families (lazy hashing): a cached root, blocks marked in its table alone, held by nobody else.
        for root, fam in self._root_family.items():
            assert fam.root == root and self._hash_to_block.get(fam.root_hash) == root
            assert self._block_hash[root] == fam.root_hash
            marked = [b for b in range(self.num_blocks) if self._block_hash[b] is fam]
            assert len(marked) == fam.pending, "a family's pending count differs from its marked blocks"
            assert set(marked) <= set(fam.table[1:]) and all(self.ref[b] <= 1 and self._block_tokens[b] is None
                                                           and self.filled[b] == self.block_size for b in marked)
            live = self.tables.get(fam.seq_id)
            assert (self._family.get(fam.seq_id) is fam) == (live is fam.table)
        for sid, fam in self._family.items():
            assert self._root_family.get(fam.root) is fam and fam.seq_id == sid
        assert all(h is None or isinstance(h, int) or self._root_family.get(h.root) is h for h in self._block_hash)
        assert self._filled_in_use == sum(self.filled[b] for b in range(self.num_blocks) if self.ref[b] > 0)
        assert self._logical == sum(len(t) for t in self.tokens.values())
        for sid, table in self.tables.items():
            assert len(table) == blocks_for_tokens(len(self.tokens[sid]), self.block_size)
        self._check_host_invariants()
