"""Attention kinds as the KV cache sees them: which of a sequence's blocks a query still reads.

A layer's kind decides how many of its sequence's blocks the cache must hold: full attention reads every
earlier token, a sliding window of W only the W - 1 tokens before the query (and the query's own). A group
of layers of one kind (harness/kv/groups.py) keeps a block table per sequence; blocks before the kind's
``first_needed_block`` are not needed by any later query and are freed (or never allocated), as vLLM's
hybrid manager does; a prefix-cache hit of a group needs only its blocks from ``first_needed_block`` of the
hit point on (impls/group_prefix.py). Adding a kind is one class here and its entry in ``ATTENTION_KINDS`` (plus
its kernel support): the allocator (impls/group_pool.py, its admissions and prefix cache) and the sizing
(harness/kv/groups.py) only call these methods.

Plain numbers only: config validation reads this module.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.impls.sizing import blocks_for_tokens


@dataclass(frozen=True)
class FullAttention:
    """Every layer's query reads every earlier token: nothing is ever freed before the sequence ends."""

    label = "full"
    window = None

    def first_needed_block(self, position: int, block_size: int) -> int:
        """The first block a query at ``position`` (and every later one) reads."""
        return 0

    def tokens_needed(self, length: int) -> int:
        """Tokens of K/V a sequence of ``length`` tokens must keep for its next query, without blocks."""
        return length


@dataclass(frozen=True)
class SlidingWindow:
    """A query at position p reads positions p - window + 1 .. p (transformers' ``sliding_window``)."""

    window: int

    @property
    def label(self) -> str:
        return f"sliding{self.window}"

    def first_needed_block(self, position: int, block_size: int) -> int:
        return max(0, position - self.window + 1) // block_size

    def tokens_needed(self, length: int) -> int:
        return min(length, self.window)


AttentionKind = FullAttention | SlidingWindow

# transformers' layer_types names -> what a model config needs to build the kind (its sliding_window).
ATTENTION_KINDS = ("full_attention", "sliding_attention")


def attention_kind(layer_type: str, sliding_window: int | None) -> AttentionKind:
    """The kind of a ``layer_types`` entry; a ValueError names the kinds supported."""
    if layer_type == "full_attention":
        return FullAttention()
    if layer_type == "sliding_attention":
        if sliding_window is None or sliding_window < 1:
            raise ValueError(f"a sliding_attention layer needs sliding_window >= 1, got {sliding_window}")
        return SlidingWindow(sliding_window)
    raise ValueError(f"attention kind {layer_type!r} is not supported; supported: {', '.join(ATTENTION_KINDS)}")


def blocks_held(kind: AttentionKind, length: int, block_size: int) -> int:
    """Blocks one sequence of ``length`` tokens holds once its last token is written: those from the first
    block its last query read to its last block (a sliding group freed the ones before as they left)."""
    if length <= 0:
        return 0
    return blocks_for_tokens(length, block_size) - kind.first_needed_block(length - 1, block_size)


def chunk_blocks(kind: AttentionKind, start: int, end: int, block_size: int) -> int:
    """Blocks a sequence holds while a chunk writes positions ``[start, end)``: from the first block the
    chunk's first query reads to the chunk's last; blocks before it are never allocated (or already freed)."""
    return blocks_for_tokens(end, block_size) - kind.first_needed_block(start, block_size)
