"""The grouped pool's admissions: a prompt's prefix hit in every group, planned once (``plan_admit``), then
taken (``admit``), whole or its first chunk only (``chunk_tokens``; the rest comes by ``append``).

A hit of ``h`` blocks (impls/group_prefix.py ``_lookup``) gives each group a table of the hit: NULL before the
first block the next query (at position ``h * block_size``) reads in that group, the cached blocks after. The
admission then writes the prompt's tokens after the hit, up to its end or its first chunk's. A hit on a cached
free block takes it from the free ones, so the plan counts it as a new block.

``GroupAdmission`` is a part of impls/group_pool.py's ``GroupedBlockPool``, kept apart by concept (as
impls/block_admission.py is of the BlockManager): it reads and writes the pool's own fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from kvbench.impls.allocator import AdmitPlan, frozen_instance
from kvbench.impls.group_prefix import NULL
from kvbench.impls.sizing import blocks_for_tokens


@dataclass(frozen=True)
class GroupAdmitPlan(AdmitPlan):
    """An admission into the grouped pool: its prefix hit and how far it reserves."""

    hits: tuple[tuple[int, ...], ...]  # per group, its table of the hit (NULL where the group needs no block)
    hashes: tuple[int, ...]  # the hit blocks' chain hashes
    end: int  # the admission writes the prompt's tokens [cached_tokens, end): all, or its first chunk


class GroupAdmission:
    """``plan_admit`` and ``admit`` of a ``GroupedBlockPool``."""

    def plan_admit(self, token_ids: Sequence[int], num_samples: int = 1, total_len: int | None = None,
                   chunk_tokens: int | None = None) -> GroupAdmitPlan:
        """The prompt's prefix hit and the blocks it takes; ``chunk_tokens``: reserve only the first chunk of
        that many tokens after the hit (the rest comes by ``append``, chunk by chunk)."""
        bs = self.block_size
        hit, hashes, hits = self._lookup(token_ids) if self.prefix_caching else (0, [], ())
        cached = hit * bs
        end = len(token_ids) if chunk_tokens is None else min(len(token_ids), cached + chunk_tokens)
        need = [0] * len(self.pools)
        new = blocks_for_tokens(end, bs) - hit
        for g, group in enumerate(self.groups):
            pool = self._group_pool[g]
            if group.kind.state_tokens is not None:  # its state's pages, whatever the prompt (no hit serves it)
                need[group.pool] += group.kind.state_blocks(bs)
                continue
            # A hit on a cached free block takes it from the free ones too.
            revived = sum(1 for b in hits[g] if b != NULL and not pool.ref[b]) if hits else 0
            need[group.pool] += new + revived
        fits = all(n + p.watermark <= p.available for n, p in zip(need, self.pools))
        return frozen_instance(GroupAdmitPlan, {"token_ids": token_ids, "num_samples": num_samples,
                                                "total_len": total_len, "cached_tokens": cached, "fits": fits,
                                                "generation": self.generation, "hits": hits,
                                                "hashes": tuple(hashes), "end": end})

    def admit(self, seq_id: int, plan: GroupAdmitPlan) -> int:
        self._check_plan(plan)
        assert seq_id not in self.tables, f"sequence {seq_id} admitted twice"
        cached = plan.cached_tokens
        tables: list[list[int]] = []
        dropped: list[int] = []
        logical = 0
        for g, group in enumerate(self.groups):
            pool, table = self._group_pool[g], list(plan.hits[g]) if plan.hits else []
            first = group.kind.first_needed_block(cached, self.block_size) if table else 0
            for b in table[first:]:
                if not pool.ref[b]:  # revived from the cached free blocks
                    del pool.cached[b]
                    self._used += pool.filled[b] * group.layers
                pool.ref[b] += 1
                logical += pool.filled[b] * group.layers
            tables.append(table)
            dropped.append(first)
        self.tables[seq_id], self.dropped[seq_id] = tables, dropped
        self.lengths[seq_id] = cached
        self._seq_logical[seq_id] = logical
        self._logical += logical
        if self.prefix_caching:
            self.tokens[seq_id] = list(plan.token_ids[:cached])
            self.hashes[seq_id] = list(plan.hashes)
        self._write(seq_id, plan.token_ids[cached:plan.end])
        self.cache_hit_tokens += cached
        self.generation += 1
        return cached
