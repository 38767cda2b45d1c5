"""Paged KV bookkeeping for a model whose layers attend differently: a block table per group of layers.

Each group (harness/kv/groups.py) is layers of one attention kind (impls/attention_kinds.py); every sequence
has a block table in each group. Pools hand out blocks: hybrid has one pool whose pages every group shares,
split_pools one per kind. A write of positions ``[start, end)`` (a prompt's chunk, or decode tokens) first
drops each group's blocks before its kind's ``first_needed_block(start)`` (a null entry, as vLLM's null
block; freed when no other sequence holds them), then allocates the blocks up to ``end``: a sliding group
holds about its window plus the chunk, and never allocates the blocks before the window of the chunk's first
query (vLLM's ``get_num_blocks_to_allocate``). An admission may reserve its prompt's first chunk only
(``plan_admit(chunk_tokens=)``) and grow by ``append`` chunk by chunk (``allocates_by_chunk``: the chunked
scheduler does, harness/serving/scheduler.py). ``fork`` shares every held block; appending into a shared,
partly filled block copies it first (copy-on-write), in each group.

Memory is counted in *layer slots*: one token's K and V in one layer (``usage_unit_layers = 1``). A page of a
group is ``block_size`` tokens of its ``page_layers`` layers; ``used`` counts the slots of real layers written,
so a padded group's padding shows as fragmentation. Prefix caching (impls/group_prefix.py) hits the longest
prefix every group can serve; freed blocks with a hash stay cached (LRU) until their pages are needed.

A state group (``LinearState``, Qwen3-Next's linear-attention layers) holds one state per sequence in
``state_blocks`` pages of the one pool, its ``state_tokens`` slots padded to whole pages (vLLM pads a state to
the attention page size too): taken with the sequence's first write, never grown, freed at its release (a
preemption releases it: the prompt is recomputed), copied whole at the first write after a fork shared it.
A recurrent state is the whole prefix folded into one matrix: the state after block ``i`` of a prompt is not
kept, so no prefix hit can serve such a group, and a pool with one has prefix caching off (``prefix_note``).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Sequence

from kvbench.impls.allocator import CacheUsage, SlotCopy, frozen_instance
from kvbench.impls.attention_kinds import AttentionKind
from kvbench.impls.fast_path import FastPath
from kvbench.impls.group_admission import GroupAdmission, GroupAdmitPlan
from kvbench.impls.group_checks import check_group_pool
from kvbench.impls.group_prefix import NULL, GroupPrefix
from kvbench.impls.sizing import blocks_for_tokens

__all__ = ["NULL", "GroupAdmitPlan", "GroupedBlockPool", "PoolGroup"]

PREFIX_STATE_NOTE = ("prefix caching off: a linear_attention layer's recurrent state folds the whole prefix into "
                     "one matrix and kvbench keeps no snapshot of it mid-prompt, so no prompt can reuse another's "
                     "prefix (every hit would need the state at the hit point): prefix_hit_rate is 0 by design")


@dataclass(frozen=True)
class PoolGroup:
    """A group as the pool needs it: its kind, its real layers, its page's layers and its pool."""

    kind: AttentionKind
    layers: int
    page_layers: int
    pool: int


class _Pool:
    __slots__ = ("num_blocks", "page_layers", "free", "ref", "filled", "watermark", "cached", "key", "by_key")

    def __init__(self, num_blocks: int, page_layers: int, watermark: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks, self.page_layers, self.watermark = num_blocks, page_layers, watermark
        self.free: deque[int] = deque(range(num_blocks))  # free blocks without a hash
        self.ref = [0] * num_blocks
        self.filled = [0] * num_blocks
        # Prefix caching: free blocks with a hash, least recently freed first; each block's (group, hash,
        # tokens) and the cached block of each (group, hash).
        self.cached: OrderedDict[int, None] = OrderedDict()
        self.key: list[tuple[int, int, tuple[int, ...]] | None] = [None] * num_blocks
        self.by_key: dict[tuple[int, int], int] = {}

    @property
    def available(self) -> int:
        """Blocks a sequence can take: the free ones and the cached ones (evicted when taken)."""
        return len(self.free) + len(self.cached)


class GroupedBlockPool(GroupAdmission, GroupPrefix, FastPath):
    """Block tables per group over one or more pools; the narrow ``KVAllocator`` plus the fast path."""

    usage_unit_layers = 1
    # The chunked scheduler may admit a prompt's first chunk and grow it by ``append`` (vLLM's V1 does).
    allocates_by_chunk = True

    def __init__(self, pool_blocks: Sequence[int], block_size: int, groups: Sequence[PoolGroup],
                 watermark: float = 0.0, prefix_caching: bool = False) -> None:
        if block_size < 1 or block_size & (block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {block_size}")
        page = {}
        for g in groups:
            if page.setdefault(g.pool, g.page_layers) != g.page_layers or g.layers > g.page_layers:
                raise ValueError(f"pool {g.pool}: its groups' pages must span one number of layers >= theirs")
        if sorted(page) != list(range(len(pool_blocks))):
            raise ValueError(f"{len(pool_blocks)} pools, but the groups name pools {sorted(page)}")
        self.block_size = block_size
        self.groups = list(groups)
        has_state = any(g.kind.state_tokens is not None for g in self.groups)
        self.pools = [_Pool(n, page[p], int(watermark * n)) for p, n in enumerate(pool_blocks)]
        self._group_pool = [self.pools[g.pool] for g in self.groups]
        self._all_layers = sum(g.layers for g in self.groups if g.kind.state_tokens is None)  # layers a token fills
        self.tables: dict[int, list[list[int]]] = {}  # seq -> per group, its block table (NULL: dropped)
        self.dropped: dict[int, list[int]] = {}  # seq -> per group, its leading NULL entries
        self.lengths: dict[int, int] = {}
        self._seq_logical: dict[int, int] = {}  # seq -> layer slots its held blocks fill (shared counted per seq)
        self._used = 0  # layer slots written in blocks held by anyone (shared counted once)
        # Sequences whose last write freed a block: due at their next step, which is not part of a simulated jump,
        # so the scheduler tries the waiting requests again as a step-by-step run would (impls/fast_path.py).
        self._freed_by: set[int] = set()
        self._logical = 0
        self.prefix_caching = prefix_caching and not has_state
        self.prefix_note = PREFIX_STATE_NOTE if prefix_caching and has_state else None
        self.tokens: dict[int, list[int]] = {}  # prefix caching: each sequence's tokens written
        self.hashes: dict[int, list[int]] = {}  # and its full blocks' chain hashes
        self.cache_hit_tokens = 0
        self.evicted_blocks = 0

    # ---- growth ------------------------------------------------------------
    def _net_blocks(self, seq_id: int, num_tokens: int) -> list[int]:
        """Per pool, blocks a write of ``num_tokens`` more takes, less those its drops free."""
        bs, n = self.block_size, self.lengths[seq_id]
        tables, dropped = self.tables[seq_id], self.dropped[seq_id]
        new = blocks_for_tokens(n + num_tokens, bs) - blocks_for_tokens(n, bs)
        net = [0] * len(self.pools)
        for g, table, d in zip(self.groups, tables, dropped):
            pool = self.pools[g.pool]
            if g.kind.state_tokens is not None:  # taken at the first write, copied at the first after a fork
                net[g.pool] += g.kind.state_blocks(bs) if not table or pool.ref[table[0]] > 1 else 0
                continue
            first = max(d, g.kind.first_needed_block(n, bs))
            freed = sum(1 for b in table[d:first] if pool.ref[b] == 1)
            cow = 1 if n % bs and pool.ref[table[-1]] > 1 else 0
            net[g.pool] += new + cow - freed
        return net

    def can_append(self, seq_id: int, num_tokens: int = 1) -> bool:
        return all(k <= p.available for k, p in zip(self._net_blocks(seq_id, num_tokens), self.pools))

    def append(self, seq_id: int, token_ids: Sequence[int]) -> list[SlotCopy]:
        copies = self.try_append(seq_id, token_ids)
        if copies is None:
            raise RuntimeError(f"sequence {seq_id}: {len(token_ids)} more tokens need more blocks than are free "
                               "(check can_append first)")
        return copies

    def try_append(self, seq_id: int, token_ids: Sequence[int]) -> list[SlotCopy] | None:
        if not self.can_append(seq_id, len(token_ids)):
            return None
        self.generation += 1
        return self._write(seq_id, token_ids)

    def _write(self, seq_id: int, token_ids: Sequence[int]) -> list[SlotCopy]:
        """Drop each group's blocks its next query no longer reads, then write ``token_ids`` (room checked)."""
        bs, n, count = self.block_size, self.lengths[seq_id], len(token_ids)
        tables, dropped = self.tables[seq_id], self.dropped[seq_id]
        copies: list[SlotCopy] = []
        logical = 0
        freed = False
        for i, g in enumerate(self.groups):  # every group's drops first: the groups of a pool share its free blocks
            pool, table, d = self.pools[g.pool], tables[i], dropped[i]
            first = g.kind.first_needed_block(n, bs)
            if first > d:
                gone = table[d:first]
                logical -= sum(map(pool.filled.__getitem__, gone)) * g.layers
                freed |= self._unref_all(pool, g, gone)
                table[d:first] = [NULL] * (first - d)
                dropped[i] = first
        if freed:
            self._freed_by.add(seq_id)
        else:
            self._freed_by.discard(seq_id)
        for i, g in enumerate(self.groups):
            pool, table = self.pools[g.pool], tables[i]
            if g.kind.state_tokens is not None:
                logical += self._write_state(pool, g, table, copies)
                continue
            off = n % bs
            if off and pool.ref[table[-1]] > 1:  # copy-on-write of a shared, partly filled block
                src, dst = table[-1], self._take(pool)
                pool.ref[src] -= 1
                pool.filled[dst] = off
                self._used += off * g.layers
                table[-1] = dst
                copies.append(SlotCopy(src * bs, dst * bs, off, g.pool))
            head = min(bs - off, count) if off else 0  # the rest of the partly filled last block
            if head:
                pool.filled[table[-1]] = off + head
            if count > head:  # then whole blocks, the last one partly filled
                new = self._take_many(pool, blocks_for_tokens(count - head, bs))
                filled = pool.filled
                for b in new:
                    filled[b] = bs
                filled[new[-1]] = count - head - (len(new) - 1) * bs
                table.extend(new)
            self._used += count * g.layers
            logical += count * g.layers
        self.lengths[seq_id] = n + count
        self._seq_logical[seq_id] += logical
        self._logical += logical
        if self.prefix_caching:
            self._register_written(seq_id, token_ids)
        return copies

    def _write_state(self, pool: _Pool, g: PoolGroup, table: list[int], copies: list[SlotCopy]) -> int:
        """A state group's write: its pages taken at the sequence's first write (returns the logical slots
        that adds), or copied whole at the first write after a fork shared them (every token rewrites the
        state); otherwise nothing: a state does not grow."""
        bs, slots = self.block_size, g.kind.state_tokens
        if not table:
            for j in range(g.kind.state_blocks(bs)):
                b = self._take(pool)
                pool.filled[b] = min(bs, slots - j * bs)
                table.append(b)
            self._used += slots * g.layers
            return slots * g.layers
        if pool.ref[table[0]] > 1:
            for j, src in enumerate(table):
                dst = self._take(pool)
                pool.ref[src] -= 1
                pool.filled[dst] = pool.filled[src]
                table[j] = dst
                copies.append(SlotCopy(src * bs, dst * bs, pool.filled[src], g.pool))
            self._used += slots * g.layers
        return 0

    def _take(self, pool: _Pool) -> int:
        b = pool.free.popleft() if pool.free else self._evict(pool)
        assert pool.ref[b] == 0
        pool.ref[b] = 1
        pool.filled[b] = 0
        return b

    def _take_many(self, pool: _Pool, count: int) -> list[int]:
        """``count`` blocks as ``_take`` takes them one by one (free ones first, then the least recently cached),
        in one pass: a 32k-token prompt takes 2,048 blocks in each group (cpu_hybrid_capacity's sweep spent
        most of its time in per-block calls)."""
        free = pool.free
        if count <= len(free):
            blocks = [free.popleft() for _ in range(count)]
        else:
            blocks = [free.popleft() if free else self._evict(pool) for _ in range(count)]
        ref = pool.ref
        for b in blocks:
            assert not ref[b], f"block {b} taken while held"
            ref[b] = 1
            pool.filled[b] = 0
        return blocks

    def _unref_all(self, pool: _Pool, g: PoolGroup, blocks: Sequence[int]) -> bool:
        """One holder less for each of ``blocks``, in order: a block no one holds then goes to the free ones, or,
        with a hash, to the cached ones (kept for a later prefix hit until its page is needed). True when any
        was freed."""
        ref, filled, key = pool.ref, pool.filled, pool.key
        freed, slots = False, 0
        for b in blocks:
            r = ref[b] - 1
            assert r >= 0, f"block {b} freed twice"
            ref[b] = r
            if r:
                continue
            freed = True
            slots += filled[b]
            if key[b] is None:
                pool.free.append(b)
            else:
                pool.cached[b] = None
        self._used -= slots * g.layers
        return freed

    # ---- fork and release ----------------------------------------------------------
    def fork(self, parent_id: int, child_id: int) -> list[SlotCopy]:
        assert child_id not in self.tables, f"sequence {child_id} exists"
        tables = [list(t) for t in self.tables[parent_id]]
        for g, table in zip(self.groups, tables):
            ref = self.pools[g.pool].ref
            for b in table:
                if b != NULL:
                    ref[b] += 1
        self.tables[child_id] = tables
        self.dropped[child_id] = list(self.dropped[parent_id])
        self.lengths[child_id] = self.lengths[parent_id]
        self._seq_logical[child_id] = self._seq_logical[parent_id]
        self._logical += self._seq_logical[child_id]
        if self.prefix_caching:
            self.tokens[child_id] = list(self.tokens[parent_id])
            self.hashes[child_id] = list(self.hashes[parent_id])
        self.generation += 1
        return []

    def release(self, seq_id: int) -> None:
        tables = self.tables.pop(seq_id)
        self.dropped.pop(seq_id)
        self.lengths.pop(seq_id)
        self._logical -= self._seq_logical.pop(seq_id)
        self._freed_by.discard(seq_id)
        self.tokens.pop(seq_id, None)
        self.hashes.pop(seq_id, None)
        self.generation += 1
        for g, table in zip(self.groups, tables):
            self._unref_all(self.pools[g.pool], g, [b for b in reversed(table) if b != NULL])

    # ---- addressing and accounting ------------------------------------------------
    def group_slots(self, seq_id: int, group: int, start: int, end: int) -> list[int]:
        """Flat slot of each position in ``[start, end)`` in ``group``'s pages; a dropped position is an error."""
        bs, table = self.block_size, self.tables[seq_id][group]
        if start < end and table[start // bs] == NULL:
            raise ValueError(f"sequence {seq_id}: position {start} left group {group}'s window; its block is freed")
        return [table[p // bs] * bs + p % bs for p in range(start, end)]

    def slots(self, seq_id: int, start: int, end: int) -> list[int]:
        """The first group's slots (a full group's where the model has one: it keeps every position)."""
        return self.group_slots(seq_id, 0, start, end)

    def num_tokens(self, seq_id: int) -> int:
        return self.lengths[seq_id]

    def max_sequence_tokens(self) -> int:
        """A prompt is written in one chunk, into every group at once: the pool with the most groups bounds it. A
        state group takes its state's pages whatever the length: they come off its pool before the token groups share
        the rest."""
        bs = self.block_size
        groups, states = [0] * len(self.pools), [0] * len(self.pools)
        for g in self.groups:
            if g.kind.state_tokens is not None:
                states[g.pool] += g.kind.state_blocks(bs)
            else:
                groups[g.pool] += 1
        return min((p.num_blocks - s) // k for p, k, s in zip(self.pools, groups, states) if k) * bs

    def usage(self) -> CacheUsage:
        return self.usage_plus_written(0)

    def usage_plus_written(self, num_tokens: int) -> CacheUsage:
        """Tokens of riding sequences fill a slot of each group's last block (every group holds it)."""
        bs = self.block_size
        pool = sum(p.num_blocks * p.page_layers for p in self.pools) * bs
        free = sum(p.available * p.page_layers for p in self.pools) * bs
        used = self._used + num_tokens * self._all_layers
        reserved = pool - free
        return frozen_instance(CacheUsage, {
            "pool_tokens": pool, "reserved_tokens": reserved, "used_tokens": used,
            "logical_tokens": self._logical + num_tokens * self._all_layers,
            "fragmentation_tokens": reserved - used, "reservation_waste_tokens": 0,
            "num_sequences": len(self.tables), "free_tokens": free, "external_fragmentation_tokens": 0})

    # ---- the fast path ---------------------------------------------------------------
    def appendable_without_alloc(self, seq_id: int) -> int:
        """Tokens written with no new block, no copy and no drop: the simulator's due append then writes
        them with its own token, dropping as the first of them would (``_write``), which is the same. None
        right after a write that freed blocks: a waiting request may fit now, which a jump would not see."""
        bs, n = self.block_size, self.lengths[seq_id]
        off = n % bs
        if not off or seq_id in self._freed_by:
            return 0
        run = bs - off
        for g, table, d in zip(self.groups, self.tables[seq_id], self.dropped[seq_id]):
            if self.pools[g.pool].ref[table[-1]] > 1:
                return 0
            if g.kind.window is not None:  # positions n.. whose query reads no block before d
                run = min(run, (d + 1) * bs + g.kind.window - 1 - n)
        return max(0, run)

    def check_invariants(self) -> None:
        """Assert the pool's invariants (tests call this after every operation): impls/group_checks.py."""
        check_group_pool(self)
