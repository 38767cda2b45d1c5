"""The block pool's growth: appended tokens fill a sequence's last block, then new ones (copy-on-write of a
shared, partly filled block first), and the simulator's fast path (impls/fast_path.py) over them.

``BlockGrowth`` is a part of impls/block_manager.py's ``BlockManager``, kept apart by concept: it
reads and writes the pool's own fields.
"""

from __future__ import annotations

from typing import Sequence

from kvbench.impls.allocator import SlotCopy
from kvbench.impls.sizing import blocks_for_tokens


class BlockGrowth:
    """``try_append`` (the scheduler's check and act in one), ``append``, ``can_append`` and the riding
    steps of a ``BlockManager``."""

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
        """``FastPath.riding_steps`` without asking for the free run apart (the simulator asks it at every
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
