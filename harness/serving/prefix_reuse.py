"""The ideal prefix-cache hit rate of a workload: what an unbounded cache would serve.

A pure function of the prompts in arrival order and the block size, block-granular as the block
manager is (impls/block_manager.py): a prompt's leading full blocks hit while each (with everything
before it) was the prefix of an earlier prompt; the first miss ends the run of hits. vLLM's
convention, which kvbench's allocator follows: a prompt's last token is always computed (its logits
pick the first output token), so a prompt made only of full blocks looks up all but its last block.
An unbounded cache keeps every full prompt block ever seen; the blocks a request generates are not
part of the workload, so they are not counted (harness/serving/conversations.py: a multi-turn history
holds drawn answers, not generated ones, so the real cache cannot hit them either).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence


@dataclass(frozen=True)
class PrefixReuse:
    hit_tokens: int  # prompt tokens an unbounded cache serves
    prompt_tokens: int

    @property
    def hit_rate(self) -> float | None:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else None


def ideal_prefix_reuse(prompts: Iterable[Sequence[int]], block_size: int) -> PrefixReuse:
    """Hits of ``prompts`` (in arrival order) in an unbounded prefix cache of ``block_size`` blocks."""
    # A block is known by its whole prefix: the key of block i is (key of block i-1, its tokens), as the
    # block manager's chain hash. Keys are Python hashes of those pairs (64 bits): a collision, which
    # could only add a hit, is as unlikely as in the block manager, which does check the tokens.
    #
    # Lazily, as the block manager hashes (impls/block_manager.py _Family): once a prompt misses at block j,
    # its blocks after j are keyed by chains through block j's key, so no later prompt can reach them
    # without first looking up that key. They are left unhashed (``pending``: key -> prompt and j) until a
    # later prompt computes that key; a workload of unrelated prompts hashes one block per prompt.
    seen: set[int] = set()
    pending: dict[int, tuple[Sequence[int], int]] = {}
    hits = total = 0
    for prompt in prompts:
        n = len(prompt)
        total += n
        full = n // block_size
        lookup = full - 1 if full * block_size == n else full
        key = 0
        for i in range(full):
            key = hash((key, tuple(prompt[i * block_size:(i + 1) * block_size])))
            if key in pending:  # a prompt whose chain was left unhashed after this key: hash it now
                _hash_rest(seen, pending, key, block_size)
            if i < lookup and key in seen:
                hits += block_size
                continue
            seen.add(key)
            if i + 1 < full:
                pending[key] = (prompt, i)
            break
    return PrefixReuse(hits, total)


def _hash_rest(seen: set[int], pending: dict[int, tuple[Sequence[int], int]], key: int, block_size: int) -> None:
    """Add the keys of the blocks after ``key`` in its pending prompt to ``seen``, as the eager loop would have."""
    prompt, j = pending.pop(key)
    for i in range(j + 1, len(prompt) // block_size):
        key = hash((key, tuple(prompt[i * block_size:(i + 1) * block_size])))
        if key in pending:  # (only a hash collision could lead into another pending chain)
            _hash_rest(seen, pending, key, block_size)
        seen.add(key)
