"""Token ids for a trace that names its prompt blocks by hash id (the Mooncake format).

A trace such as Mooncake's FAST'25 release gives no text, only ``hash_ids``: one id per block of
``hash_block_size`` (512) prompt tokens, equal ids meaning an identical prefix block. Each id's
tokens are drawn from the id itself (and the run's seed), so two prompts that share an id share
those tokens exactly, whatever kvbench's own ``block_size``: a prefix cache then finds the reuse
the trace records, at its own granularity.

A block's tokens are drawn as far as some prompt reads them (a prompt is at most ``max_seq_len``
tokens): drawing fewer of an id's tokens gives the first ones of the same draw, so the tokens do not
depend on how far a run reads. ``workload.hash_block_size`` itself is bounded by the longest prompt
or ``max_seq_len``, whichever is larger (``check_hash_block_size``): a larger block is never read past
that, so any larger value gives the same tokens, and is a typo more likely than a trace.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from kvbench.harness.errors import ConfigError

HASH_STREAM = 0x4A5B  # mixed with the seed and the id: apart from every other stream of the run


class HashBlockTokens:
    """Each hash id's tokens, drawn as far as a prompt reads them and kept (a trace repeats its ids)."""

    def __init__(self, block_size: int, vocab: int, seed: int, token_ids: Callable[[np.ndarray], list[int]]) -> None:
        self.block_size, self.vocab, self.seed, self.token_ids = block_size, vocab, seed, token_ids
        self._blocks: dict[int, list[int]] = {}

    def block(self, hash_id: int, need: int | None = None) -> list[int]:
        """At least the first ``need`` tokens of the id's block (None: all of them); maybe more, never past it."""
        need = self.block_size if need is None else min(need, self.block_size)
        toks = self._blocks.get(hash_id)
        if toks is None or len(toks) < need:
            # Drawn again from the id's own stream, longer: the same tokens first. At least twice as many
            # as before, so that prompts reading further and further draw each block a few times at most.
            size = min(self.block_size, max(need, 2 * len(toks or ())))
            rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, HASH_STREAM, hash_id])))
            toks = self._blocks[hash_id] = self.token_ids(rng.integers(0, self.vocab, size=size))
        return toks

    def prompt(self, hash_ids: Sequence[int], length: int, rng: np.random.Generator) -> list[int]:
        """``length`` tokens: the ids' blocks in order, the last one cut to fit; a prompt longer than its
        blocks (a trace that lists too few) ends in tokens of its own from ``rng``."""
        out: list[int] = []
        for h in hash_ids:
            if len(out) >= length:
                break
            out += self.block(int(h), length - len(out))
        del out[length:]
        if len(out) < length:
            out += self.token_ids(rng.integers(0, self.vocab, size=length - len(out)))
        return out


def check_hash_block_size(hash_block_size: int, max_seq_len: int, longest_prompt: int) -> None:
    """``workload.hash_block_size`` in [1, the longest of the trace's prompts and max_seq_len], or one line naming it."""
    top = max(max_seq_len, longest_prompt)
    if not 1 <= hash_block_size <= top:
        # Above ``top`` every prompt lies inside its first block, whatever the size: ``top`` draws the same tokens.
        raise ConfigError(
            f"workload.hash_block_size={hash_block_size} must be in [1, {top}] tokens: no prompt reads a block past "
            f"the trace's longest prompt ({longest_prompt} tokens) or max_seq_len={max_seq_len}, whichever is larger "
            f"({top} gives the same tokens)")
