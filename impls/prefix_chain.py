"""The block pool's prefix cache: full blocks registered under a chain hash, hashed lazily where it can be.

A full block is cached under ``chain_hash(parent hash, its token ids)``; a later prompt with the same
prefix finds it there (impls/block_admission.py). Freed blocks keep their hash until evicted.

Hashing is lazy where nothing could look a block up yet (``_Family``): a sequence whose first full
block's contents were never registered before owns its chain alone, so its later full blocks are
registered *pending*, and hashed only when a lookup could reach them (a prefix hit on that first
block), when the chain is shared (a fork, a first block of the same contents) or when its first block
leaves the cache. Every answer (hits, free and cached blocks, evictions) is the one eager hashing gives.
``block_hash``, ``block_tokens`` and ``hash_to_block`` show the tables as eager hashing keeps them (they
hash what is pending first, ``materialize``); the hot paths use the private ones.

``PrefixChains`` is a part of impls/block_manager.py's ``BlockManager``, kept apart by concept: it
reads and writes the pool's own fields.
"""

from __future__ import annotations

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


class PrefixChains:
    """The prefix cache's tables of a ``BlockManager`` (see the module docstring)."""

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
