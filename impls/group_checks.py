"""The grouped pool's invariants, asserted from its state alone (tests call them after every operation).

- Every table is as long as its sequence's blocks, its NULL entries are its leading ones, and it drops no
  block the sequence's next query reads (``first_needed_block`` of its last position); a state group's table is
  its state's pages, filled to its slots, from the sequence's first write on.
- Each block's refcount is the number of table entries holding it; a block is either held, free, or cached
  (free with a hash), never two of them; held, free and cached blocks add up to the pool.
- The used and logical slot counts are those of the held blocks.
- Prefix caching: a cached (group, hash) names a block registered under it, and each block a sequence holds
  with a hash holds exactly the tokens that hash was made of, at that position of that sequence.

Kept apart from impls/group_pool.py by concept; it reads the pool's own fields.
"""

from __future__ import annotations

from kvbench.impls.group_prefix import NULL
from kvbench.impls.prefix_chain import _ROOT_HASH, chain_hash
from kvbench.impls.sizing import blocks_for_tokens


def _check_tables(pool, holders: list[list[int]]) -> int:
    """Each sequence's tables; counts each held block's holders; returns the logical slots."""
    bs, logical = pool.block_size, 0
    for sid, tables in pool.tables.items():
        n, seq_logical = pool.lengths[sid], 0
        for g, table, d in zip(pool.groups, tables, pool.dropped[sid]):
            filled = pool.pools[g.pool].filled
            if g.kind.state_tokens is not None:  # a state: its pages from the first write on, filled to its slots
                assert len(table) == (g.kind.state_blocks(bs) if n else 0) and not d, "a state's pages are off"
                assert sum(filled[b] for b in table) == (g.kind.state_tokens if n else 0), "a state's slots are off"
                for b in table:
                    holders[g.pool][b] += 1
                    seq_logical += filled[b] * g.layers
                continue
            assert len(table) == blocks_for_tokens(n, bs), "a table's length differs from its tokens"
            assert all(b == NULL for b in table[:d]) and NULL not in table[d:], "nulls are not the leading ones"
            assert not n or d <= g.kind.first_needed_block(n - 1, bs), "a block its last query read is dropped"
            for b in table[d:]:
                holders[g.pool][b] += 1
                seq_logical += filled[b] * g.layers
            if table:
                assert filled[table[-1]] == n - (len(table) - 1) * bs or pool.pools[g.pool].ref[table[-1]] > 1
        assert seq_logical == pool._seq_logical[sid], "a sequence's logical slots differ from its blocks'"
        logical += seq_logical
    return logical


def _check_free(pool, holders: list[list[int]]) -> int:
    """Refcounts, free and cached lists; returns the used slots."""
    used = 0
    layers_of = [[0] * p.num_blocks for p in pool.pools]
    for tables in pool.tables.values():
        for g, table in zip(pool.groups, tables):
            for b in table:
                if b != NULL:
                    layers_of[g.pool][b] = g.layers
    for k, p in enumerate(pool.pools):
        assert holders[k] == p.ref, "refcounts differ from the tables holding each block"
        free, cached = set(p.free), set(p.cached)
        assert len(free) == len(p.free) and not free & cached, "a block twice in the free lists"
        assert all(p.ref[b] == 0 and p.key[b] is None for b in free), "a free block held, or with a hash"
        assert all(p.ref[b] == 0 and p.key[b] is not None for b in cached), "a cached block held, or without hash"
        assert len(free) + len(cached) + sum(1 for r in p.ref if r) == p.num_blocks, "free + cached + held != total"
        used += sum(p.filled[b] * layers_of[k][b] for b in range(p.num_blocks) if p.ref[b])
    return used


def _check_hashes(pool) -> None:
    """Registered blocks are the cached ones of their keys and hold the tokens their sequences hashed."""
    bs = pool.block_size
    for p in pool.pools:
        for (g, h), b in p.by_key.items():
            assert p.key[b] is not None and p.key[b][:2] == (g, h), "a cached hash names a block not under it"
        assert sum(k is not None for k in p.key) == len(p.by_key), "a block with a hash that is not cached"
    if not pool.prefix_caching:
        assert not any(p.by_key for p in pool.pools), "hashes registered without prefix caching"
        return
    for sid, tables in pool.tables.items():
        toks, hashes = pool.tokens[sid], pool.hashes[sid]
        assert len(toks) == pool.lengths[sid] and len(hashes) == len(toks) // bs, "a sequence's tokens are off"
        h = _ROOT_HASH
        for i, expect in enumerate(hashes):
            h = chain_hash(h, tuple(toks[i * bs:(i + 1) * bs]))
            assert h == expect, "a sequence's chain hashes differ from its tokens'"
        for g, table in enumerate(tables):
            p = pool.pools[pool.groups[g].pool]
            for i, b in enumerate(table):
                if b != NULL and p.key[b] is not None:
                    assert p.key[b] == (g, hashes[i], tuple(toks[i * bs:(i + 1) * bs])), \
                        "a block holds other tokens than its hash was made of"
                    assert p.filled[b] == bs, "a registered block is not full"


def check_group_pool(pool) -> None:
    """Assert every invariant of a ``GroupedBlockPool`` (see the module docstring)."""
    holders = [[0] * p.num_blocks for p in pool.pools]
    logical = _check_tables(pool, holders)
    used = _check_free(pool, holders)
    assert used == pool._used, "used slots differ from the held blocks' fill"
    assert logical == pool._logical, "logical slots differ from the sequences'"
    _check_hashes(pool)
