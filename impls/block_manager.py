"""Paged KV bookkeeping in pure Python: the block pool PagedAttention describes.

A pool of ``num_blocks`` blocks of ``block_size`` token slots; per-sequence block
tables (logical block -> physical block); per-block reference counts; blocks are
allocated only as tokens arrive. ``fork`` shares every block (parallel sampling);
appending into a shared, partly filled block copies it first (copy-on-write).
Full blocks are hashed by chain (parent hash, token ids) so a later request with
the same prefix reuses them; freed blocks keep their hash and stay reusable until
evicted, by the pool's eviction policy (impls/eviction.py; least recently freed first by
default), when the pool needs space. An admission hashes
each of the prompt's full blocks once: ``plan_admit`` up to the first block not
cached, ``admit`` the rest (its plan carries the hashes already made). A host tier (impls/host_tier.py)
takes evicted blocks' contents, and a prefix's lookup goes on there after the device's hits end.

Counters (filled slots, logical tokens) are kept incrementally so ``usage`` is
O(1): the capacity scenario calls it after every event at 70B scale.

``table_changes`` reports which table entries changed since it was last called, so
a device-side copy of the tables (impls/device_block_tables.py) applies only those.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Sequence

from impls.allocator import AdmitPlan, CacheUsage, KVAllocator, SlotCopy
from impls.eviction import eviction_policy
from impls.host_tier import HostTierPool, host_prefix
from impls.sizing import blocks_for_tokens

_ROOT_HASH = 0


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
        self.block_hash: list[int | None] = [None] * num_blocks
        self.block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self.hash_to_block: dict[int, int] = {}
        self.free: deque[int] = deque(range(num_blocks))  # never-cached free blocks
        self.evictable = eviction_policy(eviction, num_blocks)  # cached, refcount 0: the policy's order
        # Policies other than lru count each block's hits since its contents were written.
        self._history = eviction != "lru"
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

    # ---- derived sizes -------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free) + len(self.evictable)

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
            b = self.evictable.pop()  # the policy's victim; it forgets the block's history
            self.evicted_blocks += 1
            block_hash, cached = self.block_hash, self.hash_to_block
            h = block_hash[b]
            if self.host is not None:
                self.host.store(b, h, self.block_tokens[b])  # read before anything writes the block
            if cached.get(h) == b:  # _forget_hash, inlined: the hottest path of admissions
                del cached[h]
            block_hash[b] = self.block_tokens[b] = None
        ref = self.ref
        assert ref[b] == 0
        ref[b] = 1
        self.filled[b] = 0
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
        h = self.block_hash[b]
        if h is not None and self.hash_to_block.get(h) == b:
            del self.hash_to_block[h]
        self.block_hash[b] = None
        self.block_tokens[b] = None

    def _register(self, b: int, h: int, toks: tuple[int, ...]) -> None:
        self.block_hash[b] = h
        self.block_tokens[b] = toks
        if self.prefix_caching:
            self.hash_to_block.setdefault(h, b)  # the first block with these contents stays the cached one

    def _register_full(self, b: int, parent_hash: int, toks: tuple[int, ...]) -> None:
        self._register(b, chain_hash(parent_hash, toks), toks)

    # ---- admission --------------------------------------------------------
    def plan_admit(self, token_ids: Sequence[int], num_samples: int = 1,
                   total_len: int | None = None) -> PagedAdmitPlan:
        """Prefix hits of the prompt's full blocks (up to the first miss) and the blocks it costs.

        Forks share every block, so ``num_samples`` costs nothing here.
        """
        bs = self.block_size
        n_full = len(token_ids) // bs
        # At least one token must be computed (its logits pick the next token), so a
        # prompt made only of full cached blocks recomputes its last block.
        n_lookup = n_full - 1 if n_full * bs == len(token_ids) else n_full
        hits: list[int] = []
        h, next_hash = _ROOT_HASH, None
        # Without prefix caching nothing is looked up and no block is ever registered: no hashing at all.
        for i in range(n_lookup if self.prefix_caching else 0):
            toks = tuple(token_ids[i * bs : (i + 1) * bs])
            h = chain_hash(h, toks)
            b = self.hash_to_block.get(h)
            if b is None or self.block_tokens[b] != toks:  # a miss (a hash collision is one too)
                next_hash = h
                break
            hits.append(b)
        host: tuple[int, ...] = ()
        if self.host is not None and len(hits) < n_lookup and self.prefix_caching:  # go on in the host tier
            parent = self.block_hash[hits[-1]] if hits else _ROOT_HASH
            host, next_hash = host_prefix(self.host, token_ids, len(hits), n_lookup, bs, parent, chain_hash)
        revived = sum(1 for b in hits if self.ref[b] == 0)
        cost = blocks_for_tokens(len(token_ids), bs) - len(hits) + revived
        return PagedAdmitPlan(token_ids, num_samples, total_len, cached_tokens=(len(hits) + len(host)) * bs,
                              fits=cost + self.watermark_blocks <= self.num_free_blocks, generation=self.generation,
                              hits=tuple(hits), next_hash=next_hash, new_blocks=cost, host_hits=host)

    def admit(self, seq_id: int, plan: PagedAdmitPlan) -> int:
        self._check_plan(plan)
        assert seq_id not in self.tables, f"sequence {seq_id} admitted twice"
        token_ids, hits = plan.token_ids, plan.hits
        bs, n, ref, filled = self.block_size, len(token_ids), self.ref, self.filled
        table: list[int] = []
        h = _ROOT_HASH
        evictable, history = self.evictable, self._history
        for b in hits:
            if history:
                evictable.hit(b)
            if ref[b] == 0:
                evictable.remove(b)
                self._filled_in_use += filled[b]
            ref[b] += 1
            h = self.block_hash[b]
            table.append(b)
        count = blocks_for_tokens(n, bs) - len(hits)
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
        self._filled_in_use += n - len(hits) * bs
        self.tables[seq_id] = table
        self.tokens[seq_id] = list(token_ids)
        self._changed[seq_id] = 0
        self._logical += n
        cached = len(hits) * bs
        self.cache_hit_tokens += cached
        self.host_hit_tokens += len(plan.host_hits) * bs
        self.generation += 1
        return cached + len(plan.host_hits) * bs

    # ---- growth -------------------------------------------------------------
    def _blocks_to_append(self, seq_id: int, num_tokens: int) -> int:
        n = len(self.tokens[seq_id])
        off = n % self.block_size
        cow = 1 if off and self.ref[self.tables[seq_id][-1]] > 1 else 0
        new = blocks_for_tokens(n + num_tokens, self.block_size) - blocks_for_tokens(n, self.block_size)
        return new + cow

    def can_append(self, seq_id: int, num_tokens: int = 1) -> bool:
        return self._blocks_to_append(seq_id, num_tokens) <= len(self.free) + len(self.evictable)

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
        table, toks = self.tables[seq_id], self.tokens[seq_id]
        off, n = len(toks) % bs, len(token_ids)
        if off and off + n <= bs and self.ref[table[-1]] == 1:
            # Fast path (most appends): into an owned, partly filled block, which they may fill.
            self.generation += 1
            b = table[-1]
            toks += token_ids
            self.filled[b] = off + n
            self._filled_in_use += n
            self._logical += n
            if off + n == bs and self.prefix_caching:
                parent = self.block_hash[table[-2]] if len(table) > 1 else _ROOT_HASH
                if parent is not None:
                    self._register_full(b, parent, tuple(toks[-bs:]))
            return []
        if off == 0 and 0 < n < bs:
            # A decode step at a block boundary: a new block that the tokens leave partial.
            if not (self.free or self.evictable):
                return None
            self.generation += 1
            b = self._take_block()
            table.append(b)
            self._mark_changed(seq_id, len(table) - 1)
            toks += token_ids
            self.filled[b] = n
            self._filled_in_use += n
            self._logical += n
            return []
        # blocks_for_tokens(len + n) - blocks_for_tokens(len), plus a copy-on-write of a shared last block
        need = -(-(off + n) // bs) - (1 if off else 0) + (1 if off and self.ref[table[-1]] > 1 else 0)
        if need > len(self.free) + len(self.evictable):
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
                parent = self.block_hash[table[-2]] if len(table) > 1 else _ROOT_HASH
                if parent is not None:
                    self._register_full(b, parent, tuple(toks[-bs:]))
        self._logical += len(token_ids)
        return copies

    def appendable_without_alloc(self, seq_id: int) -> int:
        off = len(self.tokens[seq_id]) % self.block_size
        if off == 0 or self.ref[self.tables[seq_id][-1]] > 1:
            return 0  # the next token needs a new block, or a copy of the shared one
        return self.block_size - off

    def fork(self, parent_id: int, child_id: int) -> list[SlotCopy]:
        assert child_id not in self.tables, f"sequence {child_id} exists"
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
        ref, filled, block_hash, cached, evictable = self.ref, self.filled, self.block_hash, self.hash_to_block, self.evictable
        freed = 0
        for b in reversed(table):  # tail blocks become the first to be evicted
            assert ref[b] > 0, f"block {b} freed twice"
            ref[b] -= 1
            if ref[b]:
                continue
            freed += filled[b]
            h = block_hash[b]
            if h is not None and cached.get(h) == b:
                evictable.add(b)  # keep its contents for a later prefix hit
            else:
                self._forget_hash(b)
                self.free.append(b)
        self._filled_in_use -= freed

    def drop_unwritten(self, seq_id: int, written: int) -> None:
        """Blocks from the first not fully written one on, held by ``seq_id`` alone, leave the prefix
        cache (call before ``release``). A block another sequence holds stays: that one writes it
        (harness/serving/scheduler.py starts a prefill sharing it at the writer's frontier)."""
        table, ref = self.tables[seq_id], self.ref
        for b in table[written // self.block_size:]:
            if ref[b] == 1 and self.block_hash[b] is not None:
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
        reserved = self.num_used_blocks * self.block_size
        filled = self._filled_in_use + num_tokens
        return CacheUsage(
            pool_tokens=self.num_blocks * self.block_size,
            reserved_tokens=reserved,
            used_tokens=filled,
            logical_tokens=self._logical + num_tokens,
            fragmentation_tokens=reserved - filled,
            reservation_waste_tokens=0,
            num_sequences=len(self.tables),
            free_tokens=self.num_free_blocks * self.block_size,
        )

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
            assert self.ref[b] == 0 and self.block_hash[b] is None
        for b in self.evictable:
            assert self.ref[b] == 0 and self.hash_to_block.get(self.block_hash[b]) == b
        for h, b in self.hash_to_block.items():
            assert self.block_hash[b] == h and self.filled[b] == self.block_size
        assert self._filled_in_use == sum(self.filled[b] for b in range(self.num_blocks) if self.ref[b] > 0)
        assert self._logical == sum(len(t) for t in self.tokens.values())
        for sid, table in self.tables.items():
            assert len(table) == blocks_for_tokens(len(self.tokens[sid]), self.block_size)
        self._check_host_invariants()
