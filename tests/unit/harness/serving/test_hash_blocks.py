"""Token ids from hash ids: equal ids give equal tokens, whatever the cache's own block size."""

from __future__ import annotations

import numpy as np

from kvbench.harness.serving.hash_blocks import HashBlockTokens
from kvbench.harness.serving.prefix_reuse import ideal_prefix_reuse


def tokens(block=16, seed=0):
    return HashBlockTokens(block, 1000, seed, lambda ids: ids.tolist())


def rng():
    return np.random.Generator(np.random.PCG64(0))


def test_equal_ids_equal_tokens_other_ids_other_tokens():
    t = tokens()
    a = t.prompt([1, 2, 3], 40, rng())
    b = t.prompt([1, 2, 9], 48, rng())
    assert len(a) == 40 and len(b) == 48
    assert a[:32] == b[:32] and a[32:40] != b[32:40]
    assert tokens().block(7) == t.block(7) and tokens(seed=1).block(7) != t.block(7)


def test_a_prompt_longer_than_its_blocks_ends_in_tokens_of_its_own():
    p = tokens().prompt([5], 20, rng())
    assert len(p) == 20 and p[:16] == tokens().block(5)


def test_the_reuse_is_the_traces_at_any_cache_block_size():
    """Two prompts sharing 2 hash blocks of 16 tokens: an unbounded cache serves those 32 tokens at
    cache block sizes that divide 16, and the whole blocks inside them at the others."""
    t = tokens()
    prompts = [t.prompt([1, 2, 3], 48, rng()), t.prompt([1, 2, 4, 5], 60, rng())]
    for bs, hit in ((1, 32), (4, 32), (8, 32), (16, 32), (32, 32), (64, 0), (12, 24)):
        assert ideal_prefix_reuse(prompts, bs).hit_tokens == hit, bs
