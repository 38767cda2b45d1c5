"""Paged KV bookkeeping in pure Python: the block pool PagedAttention describes.

A pool of ``num_blocks`` blocks of ``block_size`` token slots; per-sequence block
tables (logical block -> physical block); per-block reference counts; blocks are
allocated only as tokens arrive. ``fork`` shares every block (parallel sampling);
appending into a shared, partly filled block copies it first (copy-on-write).
Full blocks are hashed by chain (parent hash, token ids) so a later request with
the same prefix reuses them; freed blocks keep their hash and stay reusable until
evicted, by the pool's eviction policy (impls/eviction.py; least recently freed first by
default), when the pool needs space. An admission hashes
each of the prompt's full blocks at most once: ``plan_admit`` up to the first block not
cached, ``admit`` the rest (its plan carries the hashes already made). A host tier (impls/host_tier.py)
takes evicted blocks' contents, and a prefix's lookup goes on there after the device's hits end.

Hashing is lazy where nothing could look a block up yet (``_Family``): a sequence whose first full
block's contents were never registered before owns its chain alone, so its later full blocks are
registered *pending*, and hashed only when a lookup could reach them (a prefix hit on that first
block), when the chain is shared (a fork, a first block of the same contents) or when its first block
leaves the cache. Every answer (hits, free and cached blocks, evictions) is the one eager hashing gives.
``block_hash``, ``block_tokens`` and ``hash_to_block`` show the tables as eager hashing keeps them (they
hash what is pending first, ``materialize``); the hot paths use the private ones.

Counters (filled slots, logical tokens) are kept incrementally so ``usage`` is
O(1): the capacity scenario calls it after every event at 70B scale.

``table_changes`` reports which table entries changed since it was last called, so
a device-side copy of the tables (impls/device_block_tables.py) applies only those.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Sequence

from impls.allocator import AdmitPlan, CacheUsage, KVAllocator, SlotCopy, frozen_instance
from impls.eviction import LRU, eviction_policy
from impls.host_tier import HostTierPool, host_prefix
from impls.sizing import blocks_for_tokens

_ROOT_HASH = 0


class _Family:
    """A chain of full blocks that one sequence owns alone, registered but not yet hashed.

    Its *root* (the sequence's first block) is hashed and cached like any block; when it was registered,
    no block had ever been registered with its hash, so every block whose chain starts with those contents
    is in this sequence's table. Its later full blocks are registered *pending*: their ``block_hash`` entry
    is this object, they are not in ``hash_to_block``, and they are hashed (from ``tokens``) only by
    ``BlockManager._flush``. A lookup reaches them only through a hit on the root, which flushes first; so
    do a fork, a root of the same contents, and the root's eviction. Until then each pending block is the
    cached one for its contents (no other block has them), exactly as eager hashing would have it.
    """

    __slots__ = ("seq_id", "root", "root_hash", "table", "tokens", "pending")

    def __init__(self, seq_id: int, root: int, root_hash: int, table: list[int], tokens: list[int]) -> None:
        self.seq_id, self.root, self.root_hash = seq_id, root, root_hash
        self.table, self.tokens = table, tokens  # the sequence's own lists (kept after its release)
        self.pending = 0  # blocks marked with this family and not evicted since


def chain_hash(parent_hash: int, tokens: tuple[int, ...]) -> int:
    """A full block's hash: its tokens chained to the hash of the block before it."""
    return hash((parent_hash, tokens))


@dataclass(frozen=True)
class PagedAdmitPlan(AdmitPlan):
    """An admission into the block pool: what ``plan_admit`` found, so ``admit`` looks nothing up again."""

    hits: tuple[int, ...]  # cached blocks of the prompt's leading full blocks, in order
    # The hash of the first full block after the hits, when the plan made it looking that
    # block up (it missed); admit registers the block under it instead of hashing it again.
    next_hash: int | None
    new_blocks: int  # blocks the admission takes from the free pool (a hit on a freed block counts)
    host_hits: tuple[int, ...] = ()  # chain hashes of the host tier's blocks right after ``hits``: each costs a block


class BlockManager(HostTierPool, KVAllocator):
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
        # the cached block of each hash. Read them through the properties below, which hash what is pending.
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

    # ---- the prefix cache, as eager hashing keeps it ------------------------
    @property
    def block_hash(self) -> list[int | None]:
        """Each block's chain hash (None: not registered); pending blocks are hashed first."""
        self.materialize()
        return self._block_hash

    @property
    def block_tokens(self) -> list[tuple[int, ...] | None]:
        """Each registered block's token ids; pending blocks are hashed first."""
        self.materialize()
        return self._block_tokens

    @property
    def hash_to_block(self) -> dict[int, int]:
        """The cached block of each chain hash; pending blocks are hashed (and cached) first."""
        self.materialize()
        return self._hash_to_block

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

    def _forget_hash(self, b: int) -> None:
        h = self._block_hash[b]
        if h.__class__ is _Family:
            h.pending -= 1
        elif h is not None:
            if b in self._root_family:
                self._flush(self._root_family[b])
            if self._hash_to_block.get(h) == b:
                del self._hash_to_block[h]
        self._block_hash[b] = None
        self._block_tokens[b] = None

    def _register(self, b: int, h: int, toks: tuple[int, ...]) -> None:
        self._block_hash[b] = h
        self._block_tokens[b] = toks
        if self.prefix_caching:
            self._hash_to_block.setdefault(h, b)  # the first block with these contents stays the cached one

    def _register_root(self, seq_id: int, b: int, h: int, toks: tuple[int, ...], table: list[int],
                       tokens: list[int]) -> _Family | None:
        """Register ``b``, the first block of ``seq_id``'s table, under ``h``; the sequence's pending family
        if its chain can be hashed lazily (its contents never registered before), else None."""
        cached = self._hash_to_block
        other = cached.get(h)
        if other is not None and other in self._root_family:
            self._flush(self._root_family[other])  # the same contents (or hash) again: that chain is shared now
        self._block_hash[b] = h
        self._block_tokens[b] = toks
        seen = self._seen_roots
        if other is not None:
            seen.add(h)
            return None
        cached[h] = b
        if not self._lazy or h in seen:
            seen.add(h)
            return None
        seen.add(h)
        fam = _Family(seq_id, b, h, table, tokens)
        self._root_family[b] = fam
        self._family[seq_id] = fam
        return fam

    def _register_filled(self, seq_id: int, table: list[int], b: int, toks: list[int]) -> None:
        """``b``, the last block of ``seq_id``'s table, just filled by appended tokens: registered (pending in
        the sequence's family, if it has one), unless the block before it has no hash."""
        bs = self.block_size
        if len(table) == 1:
            self._register_root(seq_id, b, chain_hash(_ROOT_HASH, tuple(toks[-bs:])), tuple(toks[-bs:]), table,
                                toks)
            return
        fam = self._family.get(seq_id)
        if fam is not None:
            self._block_hash[b] = fam
            fam.pending += 1
            return
        parent = self._block_hash[table[-2]]
        if parent is not None:
            self._register_full(b, parent, tuple(toks[-bs:]))

    def _flush(self, fam: _Family) -> None:
        """Hash and cache ``fam``'s pending blocks (as eager hashing registered them), and end the family.

        A running sequence's family may lack blocks it filled silently (``fill_is_silent``: the simulator
        owes their tokens): ``on_expose`` brings them in first, so the chain is hashed as eager appends
        would have left it."""
        if self.on_expose is not None and self._family.get(fam.seq_id) is fam:
            self.on_expose(fam.seq_id)
        del self._root_family[fam.root]
        if self._family.get(fam.seq_id) is fam:
            del self._family[fam.seq_id]
        left = fam.pending
        if not left:
            return
        fam.pending = 0
        bs, table, toks = self.block_size, fam.table, fam.tokens
        block_hash, block_tokens, cached = self._block_hash, self._block_tokens, self._hash_to_block
        h = fam.root_hash
        for d in range(1, len(table)):
            full = tuple(toks[d * bs : (d + 1) * bs])
            h = chain_hash(h, full)
            b = table[d]
            if block_hash[b] is fam:
                block_hash[b] = h
                block_tokens[b] = full
                cached.setdefault(h, b)
                left -= 1
                if not left:
                    return
        raise AssertionError("a pending block is not in its family's table")

    def materialize(self) -> None:
        """Hash every pending block now: the tables as eager hashing keeps them (nothing else changes)."""
        for fam in list(self._root_family.values()):
            self._flush(fam)

    def _register_full(self, b: int, parent_hash: int, toks: tuple[int, ...]) -> None:
        self._register(b, chain_hash(parent_hash, toks), toks)

    # ---- admission --------------------------------------------------------
    def plan_admit(self, token_ids: Sequence[int], num_samples: int = 1,
                   total_len: int | None = None) -> PagedAdmitPlan:
        """Prefix hits of the prompt's full blocks (up to the first miss) and the blocks it costs.

        Forks share every block, so ``num_samples`` costs nothing here.
        """
        bs, n = self.block_size, len(token_ids)
        n_full = n // bs
        # At least one token must be computed (its logits pick the next token), so a
        # prompt made only of full cached blocks recomputes its last block.
        n_lookup = n_full - 1 if n_full * bs == n else n_full
        hits: tuple[int, ...] = ()
        host: tuple[int, ...] = ()
        next_hash = None
        revived = 0
        # Without prefix caching nothing is looked up and no block is ever registered: no hashing at all.
        if self.prefix_caching and n_lookup:
            found: list[int] = []
            h = _ROOT_HASH
            cached, block_tokens = self._hash_to_block, self._block_tokens
            for start in range(0, n_lookup * bs, bs):
                toks = tuple(token_ids[start : start + bs])
                h = chain_hash(h, toks)
                b = cached.get(h)
                if b is None or block_tokens[b] != toks:  # a miss (a hash collision is one too)
                    next_hash = h
                    break
                if not start and b in self._root_family:  # the lookup goes on into a pending chain
                    self._flush(self._root_family[b])
                found.append(b)
            if self.host is not None and len(found) < n_lookup:  # go on in the host tier
                parent = self._block_hash[found[-1]] if found else _ROOT_HASH
                host, next_hash = host_prefix(self.host, token_ids, len(found), n_lookup, bs, parent, chain_hash)
            if found:
                ref = self.ref
                revived = sum(1 for b in found if ref[b] == 0)
                hits = tuple(found)
        cost = -(-n // bs) - len(hits) + revived
        free = len(self.free) + (len(self._lru) if self._lru is not None else len(self.evictable))
        return frozen_instance(PagedAdmitPlan, {
            "token_ids": token_ids, "num_samples": num_samples, "total_len": total_len,
            "cached_tokens": (len(hits) + len(host)) * bs, "fits": cost + self.watermark_blocks <= free,
            "generation": self.generation, "hits": hits, "next_hash": next_hash, "new_blocks": cost,
            "host_hits": host})

    def admit(self, seq_id: int, plan: PagedAdmitPlan) -> int:
        self._check_plan(plan)
        assert seq_id not in self.tables, f"sequence {seq_id} admitted twice"
        token_ids, hits = plan.token_ids, plan.hits
        bs, n, ref, filled, block_hash = self.block_size, len(token_ids), self.ref, self.filled, self._block_hash
        table: list[int] = []
        h = _ROOT_HASH
        if hits:
            evictable, history, lru = self.evictable, self._history, self._lru
            revived = 0
            for b in hits:
                if history:
                    evictable.hit(b)
                if ref[b] == 0:
                    if lru is not None:
                        del lru[b]
                    else:
                        evictable.remove(b)
                    revived += filled[b]
                ref[b] += 1
                table.append(b)
            h = block_hash[hits[-1]]
            self._filled_in_use += revived
        tokens = list(token_ids)
        if plan.host_hits or self.host is not None:
            self._admit_blocks_one_by_one(plan, table, h)
        else:
            self._admit_blocks(seq_id, plan, table, tokens, h)
        self._filled_in_use += n - len(hits) * bs
        self.tables[seq_id] = table
        self.tokens[seq_id] = tokens
        self._changed[seq_id] = 0
        self._logical += n
        cached = len(hits) * bs
        self.cache_hit_tokens += cached
        self.host_hit_tokens += len(plan.host_hits) * bs
        self.generation += 1
        return cached + len(plan.host_hits) * bs

    def _admit_blocks(self, seq_id: int, plan: PagedAdmitPlan, table: list[int], tokens: list[int], h: int) -> None:
        """The blocks of ``plan``'s prompt after its hits, taken and (full ones, with prefix caching)
        registered in order, into ``table``: ``_admit_blocks_one_by_one`` in one loop, without a host tier.

        Each block is taken just before it is registered, as there: an eviction forgets its victim's hash,
        and a registration keeps the first block with its hash, so the order decides which block stays
        the cached one when contents repeat. A new chain's blocks after its root are pending (``_Family``)."""
        token_ids, bs = plan.token_ids, self.block_size
        n = len(token_ids)
        ref, filled, block_hash, block_tokens, cached = (self.ref, self.filled, self._block_hash, self._block_tokens,
                                                         self._hash_to_block)
        free, lru, evictable, history = self.free, self._lru, self.evictable, self._history
        caching, next_hash = self.prefix_caching, plan.next_hash
        fam: _Family | None = None
        roots = self._root_family
        evicted = pending = 0
        last_full = n - bs  # a block starting at or before this is full
        for start in range(len(table) * bs, n, bs):
            if free:
                b = free.popleft()
                if history:
                    evictable.forget(b)  # new contents: an earlier tenant's hits are not its own
            else:  # _evict, inlined: the hottest path of admissions into a full pool
                b = lru.popitem(False)[0] if lru is not None else evictable.pop()
                evicted += 1
                old = block_hash[b]
                if old.__class__ is _Family:
                    old.pending -= 1
                else:
                    if b in roots:  # a chain's first block leaves (its family, if any is pending, is hashed)
                        gone = roots[b]
                        if gone.pending or gone.seq_id in self._family:
                            self._flush(gone)
                        else:
                            del roots[b]
                    if cached.get(old) == b:
                        del cached[old]
                    block_tokens[b] = None
                block_hash[b] = None
            ref[b] = 1
            if start <= last_full:
                filled[b] = bs
                if fam is not None:  # a new chain's block after its root: registered, hashed when needed
                    block_hash[b] = fam
                    pending += 1
                elif caching:
                    toks = tuple(token_ids[start : start + bs])
                    if next_hash is None:
                        h = chain_hash(h, toks)
                    else:  # the plan hashed the first miss
                        h, next_hash = next_hash, None
                    if start:
                        block_hash[b] = h
                        block_tokens[b] = toks
                        cached.setdefault(h, b)  # the first block with these contents stays the cached one
                    else:
                        table.append(b)  # the family keeps the table
                        fam = self._register_root(seq_id, b, h, toks, table, tokens)
                        continue
            else:
                filled[b] = n - start
            table.append(b)
        if fam is not None:
            fam.pending += pending
        self.evicted_blocks += evicted

    def _admit_blocks_one_by_one(self, plan: PagedAdmitPlan, table: list[int], h: int) -> None:
        """``_admit_blocks`` with a host tier: host hits first (each a block and a copy back), then the rest."""
        token_ids, bs = plan.token_ids, self.block_size
        n, filled = len(token_ids), self.filled
        count = -(-n // bs) - len(table)
        # Taking from the never-cached blocks touches no hash, so they may all be taken first; an
        # eviction forgets a hash, so then each block is taken just before it is registered.
        fresh = self._take_blocks(count) if count <= len(self.free) else None
        if plan.host_hits:
            h = self._load_host(plan.host_hits, token_ids, table, fresh)
        take, register, next_hash, caching = self._take_block, self._register, plan.next_hash, self.prefix_caching
        for i, start in enumerate(range(len(table) * bs, n, bs)):
            b = take() if fresh is None else fresh[i]
            if start + bs <= n:
                filled[b] = bs
                if caching:
                    toks = tuple(token_ids[start : start + bs])
                    h = chain_hash(h, toks) if next_hash is None else next_hash  # the plan hashed the first miss
                    next_hash = None
                    register(b, h, toks)
            else:
                filled[b] = n - start
            table.append(b)

    # ---- growth -------------------------------------------------------------
    def _blocks_to_append(self, seq_id: int, num_tokens: int) -> int:
        n = len(self.tokens[seq_id])
        off = n % self.block_size
        cow = 1 if off and self.ref[self.tables[seq_id][-1]] > 1 else 0
        new = blocks_for_tokens(n + num_tokens, self.block_size) - blocks_for_tokens(n, self.block_size)
        return new + cow

    def can_append(self, seq_id: int, num_tokens: int = 1) -> bool:
        return self._blocks_to_append(seq_id, num_tokens) <= self.num_free_blocks

    def append(self, seq_id: int, token_ids: Sequence[int]) -> list[SlotCopy]:
        copies = self.try_append(seq_id, token_ids)
        if copies is None:
            raise RuntimeError(f"sequence {seq_id}: {len(token_ids)} more tokens need more blocks than are free "
                               "(check can_append first)")
        return copies

    def try_append(self, seq_id: int, token_ids: Sequence[int]) -> list[SlotCopy] | None:
        """``append`` if the free pool holds what it needs (``can_append``), else None, nothing changed:
        the scheduler's check and act in one call."""
        bs = self.block_size
        toks = self.tokens[seq_id]
        off, n = len(toks) & (bs - 1), len(token_ids)
        if off:
            table = self.tables[seq_id]
            b = table[-1]
            end = off + n
            if end <= bs and self.ref[b] == 1:
                # Fast path (most appends): into an owned, partly filled block, which they may fill.
                self.generation += 1
                toks += token_ids
                self.filled[b] = end
                self._filled_in_use += n
                self._logical += n
                if end == bs and self.prefix_caching:
                    fam = self._family.get(seq_id)
                    if fam is not None:  # pending: hashed when a lookup could reach it
                        self._block_hash[b] = fam
                        fam.pending += 1
                    else:
                        self._register_filled(seq_id, table, b, toks)
                return []
            if bs < end < 2 * bs and self.ref[b] == 1:
                # The simulator's owed tokens of a silent fill (``fill_is_silent``): they fill the owned last
                # block, and the rest start a new one, as two appends would (fill, register, then take).
                free = self.free
                lru = self._lru
                if not (free or (lru if lru is not None else self.evictable)):
                    return None
                self.generation += 1
                fill = bs - off
                toks += token_ids[:fill]
                self.filled[b] = bs
                if self.prefix_caching:
                    fam = self._family.get(seq_id)
                    if fam is not None:
                        self._block_hash[b] = fam
                        fam.pending += 1
                    else:
                        self._register_filled(seq_id, table, b, toks)
                if free:
                    nb = free.popleft()
                    if self._history:
                        self.evictable.forget(nb)
                else:
                    nb = self._evict()
                ref = self.ref
                assert ref[nb] == 0
                ref[nb] = 1
                rest = end - bs
                self.filled[nb] = rest
                table.append(nb)
                index = len(table) - 1
                if index < self._changed.get(seq_id, index + 1):
                    self._changed[seq_id] = index
                toks += token_ids[fill:]
                self._filled_in_use += n
                self._logical += n
                return []
        elif 0 < n < bs:
            # A decode step at a block boundary: a new block that the tokens leave partial.
            free = self.free
            if free:
                b = free.popleft()
                if self._history:
                    self.evictable.forget(b)  # new contents: an earlier tenant's hits are not its own
            elif self._lru if self._lru is not None else self.evictable:
                b = self._evict()
            else:
                return None
            ref = self.ref
            assert ref[b] == 0
            ref[b] = 1
            self.filled[b] = n
            self.generation += 1
            table = self.tables[seq_id]
            table.append(b)
            index = len(table) - 1
            if index < self._changed.get(seq_id, index + 1):  # _mark_changed, inlined
                self._changed[seq_id] = index
            toks += token_ids
            self._filled_in_use += n
            self._logical += n
            return []
        return self._append_blocks(seq_id, token_ids)

    def _append_blocks(self, seq_id: int, token_ids: Sequence[int]) -> list[SlotCopy] | None:
        """``try_append``'s general case: any number of tokens, copy-on-write of a shared last block."""
        bs = self.block_size
        table, toks = self.tables[seq_id], self.tokens[seq_id]
        off = len(toks) % bs
        # blocks_for_tokens(len + n) - blocks_for_tokens(len), plus a copy-on-write of a shared last block
        need = -(-(off + len(token_ids)) // bs) - (1 if off else 0) + (1 if off and self.ref[table[-1]] > 1 else 0)
        if need > self.num_free_blocks:
            return None
        self.generation += 1
        # Block by block, not token by token: the simulator appends many tokens at once.
        copies: list[SlotCopy] = []
        done = 0
        while done < len(token_ids):
            off = len(toks) % bs
            if off == 0:
                table.append(self._take_block())
                self._mark_changed(seq_id, len(table) - 1)
            elif self.ref[table[-1]] > 1:  # copy-on-write of a shared, partly filled block
                src = table[-1]
                dst = self._take_block()
                self.ref[src] -= 1
                self.filled[dst] = off
                self._filled_in_use += off
                table[-1] = dst
                self._mark_changed(seq_id, len(table) - 1)
                copies.append(SlotCopy(src * bs, dst * bs, off))
            b = table[-1]
            take = min(bs - off, len(token_ids) - done)
            toks.extend(token_ids[done : done + take])
            done += take
            # A shared block's fill is the max over its holders: only slots past it are new states.
            end = off + take
            if self.filled[b] < end:
                self._filled_in_use += end - max(self.filled[b], off)
                self.filled[b] = end
            if end == bs and self.prefix_caching:
                self._register_filled(seq_id, table, b, toks)
        self._logical += len(token_ids)
        return copies

    def appendable_without_alloc(self, seq_id: int) -> int:
        off = len(self.tokens[seq_id]) % self.block_size
        if off == 0 or self.ref[self.tables[seq_id][-1]] > 1:
            return 0  # the next token needs a new block, or a copy of the shared one
        return self.block_size - off

    def riding_steps(self, seq_id: int) -> int:
        """``KVAllocator.riding_steps`` without asking for the free run apart (the simulator asks it at every
        event of a sequence)."""
        off = len(self.tokens[seq_id]) & (self.block_size - 1)
        if off == 0 or self.ref[self.tables[seq_id][-1]] > 1:
            return 1
        return self.block_size - off + self.fill_is_silent(seq_id)

    def fill_is_silent(self, seq_id: int) -> bool:
        """Without prefix caching a full block is never looked up. With it, a sequence whose chain is pending
        (``_Family``) marks its filled blocks pending, which only a lookup of its root can reach, and that
        lookup flushes the family first: with ``on_expose`` set, the simulator's owed tokens come in then."""
        return not self.prefix_caching or (self.on_expose is not None and seq_id in self._family)

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
