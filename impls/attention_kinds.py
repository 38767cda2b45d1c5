"""Attention kinds as the KV cache sees them: which of a sequence's blocks a query still reads, and what a
layer keeps per token or per sequence.

A layer's kind decides how many of its sequence's blocks the cache must hold: full attention reads every
earlier token, a sliding window of W only the W - 1 tokens before the query (and the query's own). A group
of layers of one kind (harness/kv/groups.py) keeps a block table per sequence; blocks before the kind's
``first_needed_block`` are not needed by any later query and are freed (or never allocated), as vLLM's
hybrid manager does; a prefix-cache hit of a group needs only its blocks from ``first_needed_block`` of the
hit point on (impls/group_prefix.py). Adding a kind is one class here and its entry in ``ATTENTION_KINDS`` (plus
its kernel support): the allocator (impls/group_pool.py, its admissions and prefix cache) and the sizing
(harness/kv/groups.py) only call these methods.

Two kinds keep something else than K and V per head (harness/kv/latent.py says what): ``LatentAttention`` (MLA:
DeepSeek, Kimi) is full attention whose token costs ``kv_lora_rank + qk_rope_head_dim`` values a layer, and
``LinearState`` (Qwen3-Next's Gated DeltaNet) keeps no token at all but one fixed state per sequence, held in the
pool as ``state_tokens`` slots of its pages (whole pages: the state padded to the page size, as vLLM does):
allocated with the sequence's first write, never grown, freed at its release, copied on its first write after a
fork (the state changes with every token), and never a prefix-cache hit (a state mid-prompt is not kept).

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
    state_tokens = None  # keeps tokens, not a fixed state

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
    state_tokens = None

    @property
    def label(self) -> str:
        return f"sliding{self.window}"

    def first_needed_block(self, position: int, block_size: int) -> int:
        return max(0, position - self.window + 1) // block_size

    def tokens_needed(self, length: int) -> int:
        return min(length, self.window)


@dataclass(frozen=True)
class LatentAttention(FullAttention):
    """Multi-head latent attention: full attention (every earlier token read) whose token keeps one latent of
    ``kv_lora_rank`` values and a rotary key of ``rope_dim`` values that every head shares."""

    kv_lora_rank: int = 0
    rope_dim: int = 0
    label = "latent"

    @property
    def values_per_token(self) -> int:
        """Values one token keeps in one layer of this kind (DeepSeek-V3: 576)."""
        return self.kv_lora_rank + self.rope_dim


@dataclass(frozen=True)
class LinearState:
    """Linear attention: no K/V per token, one fixed state per sequence, ``state_tokens`` slots of a caching
    layer's token (harness/kv/latent.py ``state_tokens``), whatever the sequence's length."""

    state_tokens: int
    label = "linear"
    window = None

    def first_needed_block(self, position: int, block_size: int) -> int:
        return 0  # its pages hold the state, which every later token reads and rewrites

    def tokens_needed(self, length: int) -> int:
        return self.state_tokens if length > 0 else 0

    def state_blocks(self, block_size: int) -> int:
        """Pages one sequence's state takes: its slots rounded up to whole pages (the padding vLLM pays too)."""
        return blocks_for_tokens(self.state_tokens, block_size)


AttentionKind = FullAttention | SlidingWindow | LatentAttention | LinearState

# transformers' layer_types names -> what a model config needs to build the kind (its sliding_window).
ATTENTION_KINDS = ("full_attention", "sliding_attention", "linear_attention")


def attention_kind(layer_type: str, sliding_window: int | None, state_tokens: int | None = None) -> AttentionKind:
    """The kind of a ``layer_types`` entry (a linear_attention layer's state in ``state_tokens`` slots); a
    ValueError names the kinds supported."""
    if layer_type == "full_attention":
        return FullAttention()
    if layer_type == "sliding_attention":
        if sliding_window is None or sliding_window < 1:
            raise ValueError(f"a sliding_attention layer needs sliding_window >= 1, got {sliding_window}")
        return SlidingWindow(sliding_window)
    if layer_type == "linear_attention":
        if state_tokens is None or state_tokens < 1:
            raise ValueError(f"a linear_attention layer needs a state (got {state_tokens} token slots): set "
                             "model.linear_num_key_heads, linear_num_value_heads, linear_key_head_dim, "
                             "linear_value_head_dim and linear_conv_kernel_dim > 0")
        return LinearState(state_tokens)
    raise ValueError(f"attention kind {layer_type!r} is not supported; supported: {', '.join(ATTENTION_KINDS)}")


def blocks_held(kind: AttentionKind, length: int, block_size: int) -> int:
    """Blocks one sequence of ``length`` tokens holds once its last token is written: those from the first
    block its last query read to its last block (a sliding group freed the ones before as they left); a
    state's pages, whatever the length."""
    if length <= 0:
        return 0
    if kind.state_tokens is not None:
        return kind.state_blocks(block_size)
    return blocks_for_tokens(length, block_size) - kind.first_needed_block(length - 1, block_size)


def chunk_blocks(kind: AttentionKind, start: int, end: int, block_size: int) -> int:
    """Blocks a sequence holds while a chunk writes positions ``[start, end)``: from the first block the
    chunk's first query reads to the chunk's last; blocks before it are never allocated (or already freed)."""
    if kind.state_tokens is not None:
        return kind.state_blocks(block_size)
    return blocks_for_tokens(end, block_size) - kind.first_needed_block(start, block_size)
