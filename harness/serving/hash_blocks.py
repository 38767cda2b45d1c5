"""Token ids for a trace that names its prompt blocks by hash id (the Mooncake format).

A trace such as Mooncake's FAST'25 release gives no text, only ``hash_ids``: one id per block of
``hash_block_size`` (512) prompt tokens, equal ids meaning an identical prefix block. Each id's
tokens are drawn from the id itself (and the run's seed), so two prompts that share an id share
those tokens exactly, whatever kvbench's own ``block_size``: a prefix cache then finds the reuse
the trace records, at its own granularity.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

HASH_STREAM = 0x4A5B  # mixed with the seed and the id: apart from every other stream of the run


class HashBlockTokens:
    """Each hash id's tokens, drawn once and kept (a trace repeats its ids)."""

    def __init__(self, block_size: int, vocab: int, seed: int, token_ids: Callable[[np.ndarray], list[int]]) -> None:
        self.block_size, self.vocab, self.seed, self.token_ids = block_size, vocab, seed, token_ids
        self._blocks: dict[int, list[int]] = {}

    def block(self, hash_id: int) -> list[int]:
        toks = self._blocks.get(hash_id)
        if toks is None:
            rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, HASH_STREAM, hash_id])))
            toks = self._blocks[hash_id] = self.token_ids(rng.integers(0, self.vocab, size=self.block_size))
        return toks

    def prompt(self, hash_ids: Sequence[int], length: int, rng: np.random.Generator) -> list[int]:
        """``length`` tokens: the ids' blocks in order, the last one cut to fit; a prompt longer than its
        blocks (a trace that lists too few) ends in tokens of its own from ``rng``."""
        out: list[int] = []
        for h in hash_ids:
            if len(out) >= length:
                break
            out += self.block(int(h))
        del out[length:]
        if len(out) < length:
            out += self.token_ids(rng.integers(0, self.vocab, size=length - len(out)))
        return out
