"""The block pool's admissions: a prompt's prefix hits, planned once (``plan_admit``), then taken (``admit``).

An admission hashes each of the prompt's full blocks at most once: ``plan_admit`` up to the first
block not cached, ``admit`` the rest (its plan carries the hashes already made). A host tier
(impls/host_tier.py) takes evicted blocks' contents, and a prefix's lookup goes on there after the
device's hits end. ``BlockAdmission`` is a part of impls/block_manager.py's ``BlockManager``, kept
apart by concept: it reads and writes the pool's own fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from kvbench.impls.allocator import AdmitPlan, frozen_instance
from kvbench.impls.host_tier import host_prefix
from kvbench.impls.prefix_chain import _ROOT_HASH, _Family, chain_hash


@dataclass(frozen=True)
class PagedAdmitPlan(AdmitPlan):
    """An admission into the block pool: what ``plan_admit`` found, so ``admit`` looks nothing up again."""

    hits: tuple[int, ...]  # cached blocks of the prompt's leading full blocks, in order
    # The hash of the first full block after the hits, when the plan made it looking that
    # block up (it missed); admit registers the block under it instead of hashing it again.
    next_hash: int | None
    new_blocks: int  # blocks the admission takes from the free pool (a hit on a freed block counts)
    host_hits: tuple[int, ...] = ()  # chain hashes of the host tier's blocks right after ``hits``: each costs a block


class BlockAdmission:
    """``plan_admit`` and ``admit`` of a ``BlockManager``."""

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
