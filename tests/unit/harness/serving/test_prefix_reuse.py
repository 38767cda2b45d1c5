"""The ideal hit rate: an unbounded prefix cache over the prompts in arrival order, block by block."""

from __future__ import annotations

import random

import pytest

from kvbench.harness.serving.prefix_reuse import ideal_prefix_reuse
from kvbench.impls.block_manager import BlockManager


def test_hand_built_cases():
    bs = 4
    a = tuple(range(10))  # 2 full blocks + 2 tokens
    assert ideal_prefix_reuse([a], bs).hit_tokens == 0
    # the same prompt again: both full blocks hit (its last token is in the partial block)
    assert ideal_prefix_reuse([a, a], bs).hit_tokens == 8
    # a block-aligned prompt seen before recomputes its last block (its last token is always computed)
    b = tuple(range(8))
    assert ideal_prefix_reuse([b, b], bs).hit_tokens == 4
    # a prompt sharing only the first block, then one that differs in the first token
    c = (0, 1, 2, 3, 99, 98, 97, 96, 5)
    d = (7, 1, 2, 3, 4, 5, 6, 7, 8)
    r = ideal_prefix_reuse([a, c, d], bs)
    assert (r.hit_tokens, r.prompt_tokens) == (4, 28) and r.hit_rate == pytest.approx(4 / 28)
    # equal blocks after different prefixes are different blocks (a chain, not a bag)
    e = (9, 9, 9, 9) + a[4:8] + (1,)
    assert ideal_prefix_reuse([a, e], bs).hit_tokens == 0
    # order matters only for who comes first: a short prompt after its extension hits its own full block
    assert ideal_prefix_reuse([a, a[:5]], bs).hit_tokens == 4
    assert ideal_prefix_reuse([], bs).hit_rate is None


def test_an_unbounded_block_manager_agrees():
    """Admitting each prompt in turn (and releasing it) into a block manager too big to evict gives the
    same hits at every block size, on prompts with shared prefixes of random lengths."""
    rng = random.Random(7)
    for bs in (1, 2, 4, 16):
        base = [rng.randrange(5) for _ in range(80)]
        prompts = [tuple(base[:rng.randint(0, 60)] + [rng.randrange(5) for _ in range(rng.randint(1, 30))])
                   for _ in range(40)]
        bm = BlockManager(10_000, bs)
        for sid, p in enumerate(prompts):
            bm.admit(sid, bm.plan_admit(p))
            bm.release(sid)
        ideal = ideal_prefix_reuse(prompts, bs)
        assert ideal.hit_tokens == bm.cache_hit_tokens, bs
        assert ideal.prompt_tokens == sum(map(len, prompts))


def _eager_reuse(prompts, bs):
    """ideal_prefix_reuse as first written: every full block of every prompt hashed in turn."""
    seen, hits, total = set(), 0, 0
    for prompt in prompts:
        n = len(prompt)
        total += n
        full = n // bs
        lookup = full - 1 if full * bs == n else full
        key, hitting = 0, True
        for i in range(full):
            key = hash((key, tuple(prompt[i * bs:(i + 1) * bs])))
            if hitting and i < lookup and key in seen:
                hits += bs
            else:
                hitting = False
                seen.add(key)
    return hits, total


def test_lazy_chains_give_the_eager_hits():
    """Chains left unhashed until a later prompt reaches them: the same hits as hashing every block, on
    prompts that repeat, extend, cut short and branch off each other (tiny vocabularies: many equal blocks)."""
    rng = random.Random(11)
    for trial in range(60):
        bs = rng.choice((1, 2, 3, 4, 16))
        vocab = rng.choice((1, 2, 3, 50))
        pool: list[tuple[int, ...]] = []
        for _ in range(rng.randint(1, 50)):
            if pool and rng.random() < 0.6:  # from an earlier prompt: repeated, cut, extended or branched
                base = rng.choice(pool)
                cut = rng.randint(0, len(base))
                tail = tuple(rng.randrange(vocab) for _ in range(rng.choice((0, 1, bs, 3 * bs + 1))))
                prompt = base[:cut] + tail if rng.random() < 0.7 else base
            else:
                prompt = tuple(rng.randrange(vocab) for _ in range(rng.randint(0, 6 * bs)))
            pool.append(prompt)
        got = ideal_prefix_reuse(pool, bs)
        assert (got.hit_tokens, got.prompt_tokens) == _eager_reuse(pool, bs), (trial, bs, vocab)
