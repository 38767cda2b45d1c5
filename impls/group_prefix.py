"""Prefix caching across KV-cache groups: a hit is the longest prefix every group can serve (vLLM's hybrid rule).

A full block of a sequence is registered, in each group that holds it, under ``(group, chain hash)``: the hash of
its tokens chained to every block before it (impls/prefix_chain.py ``chain_hash``, as the uniform BlockManager).
A block freed with a hash is kept in its pool's LRU of cached blocks (``_Pool.cached``), still free: a later
prompt may revive it, and a new block is taken from it only when no never-cached block is left (the oldest
goes first, its hash forgotten: ``evicted_blocks``).

A lookup (``_lookup``) finds the longest prefix of ``h`` full blocks whose every group holds what the next
query reads: a group of kind ``k`` needs blocks ``k.first_needed_block(h * block_size)`` .. ``h - 1`` cached.
A full group needs them all, so its hits are a leading run (scanned left to right, stopping at the first
miss); a sliding group needs only its window's blocks before the hit point, so it is scanned right to left
from the candidate point, and a miss at block ``i`` moves the candidate to ``i`` (no point above ``i`` can
hold a run through it), until every group agrees (vLLM's ``SlidingWindowManager.find_longest_cache_hit``,
with every group of a kind asked, and each kind asked again until the point holds for all).

``GroupPrefix`` is a part of impls/group_pool.py's ``GroupedBlockPool``, kept apart by concept: it reads and
writes the pool's own fields. Plain Python: config validation and the capacity scenario read it.
"""

from __future__ import annotations

from typing import Sequence

from kvbench.impls.prefix_chain import _ROOT_HASH, chain_hash

NULL = -1  # a table entry whose block was freed (or never allocated): no query reads it any more


class GroupPrefix:
    """The prefix cache of a ``GroupedBlockPool`` (see the module docstring)."""

    # ---- lookup -------------------------------------------------------------------
    def _cached_block(self, group: int, h: int, toks: tuple[int, ...]) -> int | None:
        """The cached block of ``group`` with chain hash ``h`` and these tokens (a hash collision is a miss)."""
        pool = self._group_pool[group]
        b = pool.by_key.get((group, h))
        if b is None or pool.key[b][2] != toks:
            return None
        return b

    def _lookup(self, token_ids: Sequence[int]) -> tuple[int, list[int], tuple[tuple[int, ...], ...]]:
        """(hit blocks, their chain hashes, per group its table of the hit: NULL where it needs no block)."""
        bs, n = self.block_size, len(token_ids)
        n_full = n // bs
        # At least one token is computed (its logits pick the next token): a prompt of only full blocks
        # recomputes its last one, as the BlockManager does.
        n_lookup = n_full - 1 if n_full * bs == n else n_full
        if n_lookup <= 0:
            return 0, [], ()
        full = [i for i, g in enumerate(self.groups) if g.kind.window is None]
        hashes: list[int] = []
        toks: list[tuple[int, ...]] = []
        h = _ROOT_HASH
        lead = n_lookup
        for i in range(n_lookup):  # the full groups' common leading run (every block's hash, without one)
            block = tuple(token_ids[i * bs:(i + 1) * bs])
            h = chain_hash(h, block)
            hashes.append(h)
            toks.append(block)
            if any(self._cached_block(g, h, block) is None for g in full):
                lead = i
                break
        hit = self._sliding_point(lead, hashes, toks)
        if not hit:
            return 0, [], ()
        tables = []
        for g, group in enumerate(self.groups):
            first = group.kind.first_needed_block(hit * bs, bs)
            held = [self._cached_block(g, hashes[i], toks[i]) for i in range(first, hit)]
            tables.append(tuple([NULL] * first + held))
        return hit, hashes[:hit], tuple(tables)

    def _sliding_point(self, hit: int, hashes: list[int], toks: list[tuple[int, ...]]) -> int:
        """The largest point ``<= hit`` at which every windowed group holds the blocks its next query reads."""
        bs = self.block_size
        sliding = [(g, group.kind) for g, group in enumerate(self.groups) if group.kind.window is not None]
        settled = False
        while hit and not settled:
            settled = True
            for g, kind in sliding:
                first = kind.first_needed_block(hit * bs, bs)
                for i in range(hit - 1, first - 1, -1):  # right to left: the first miss moves the point to it
                    if self._cached_block(g, hashes[i], toks[i]) is None:
                        hit, settled = i, False
                        break
                if not settled or not hit:
                    break
        return hit

    # ---- registration and eviction -----------------------------------------------------
    def _register_written(self, seq_id: int, token_ids: Sequence[int]) -> None:
        """``token_ids`` were just written after the sequence's earlier tokens: each block they fill is
        registered in every group that holds it (a sliding group holds every block of the write)."""
        bs = self.block_size
        toks, hashes, tables = self.tokens[seq_id], self.hashes[seq_id], self.tables[seq_id]
        toks.extend(token_ids)
        for i in range(len(hashes), len(toks) // bs):
            block = tuple(toks[i * bs:(i + 1) * bs])
            h = chain_hash(hashes[-1] if hashes else _ROOT_HASH, block)
            hashes.append(h)
            for g, table in enumerate(tables):
                b = table[i]
                pool = self._group_pool[g]
                # The first block with these contents stays the cached one (the BlockManager's rule).
                if b != NULL and pool.key[b] is None and (g, h) not in pool.by_key:
                    pool.by_key[(g, h)] = b
                    pool.key[b] = (g, h, block)

    def _forget(self, pool, b: int) -> None:
        g, h, _ = pool.key[b]
        del pool.by_key[(g, h)]
        pool.key[b] = None

    def _evict(self, pool) -> int:
        """The least recently freed cached block, its hash forgotten: a new block when none is free."""
        b, _ = pool.cached.popitem(last=False)
        self._forget(pool, b)
        self.evicted_blocks += 1
        return b

    def drop_unwritten(self, seq_id: int, written: int) -> None:
        """Blocks from the first not fully written one on, held by ``seq_id`` alone, leave the prefix cache
        (an admission that reserved its whole prompt and leaves part way through its prefill)."""
        if not self.prefix_caching:
            return
        for g, table in enumerate(self.tables[seq_id]):
            pool = self._group_pool[g]
            for b in table[written // self.block_size:]:
                if b != NULL and pool.ref[b] == 1 and pool.key[b] is not None:
                    self._forget(pool, b)
