"""The interface between the engine/scheduler and every KV-cache implementation.

Two halves, so the capacity scenario can run the bookkeeping alone at 70B scale:

* ``KVAllocator`` - pure Python: which rows of a flat KV store each sequence owns.
  A "row" is one token's K (or V) for one layer; a contiguous slab is a pool whose
  single block per sequence is ``max_seq_len`` rows long, a paged pool has blocks
  of ``block_size`` rows. Copies (fork, copy-on-write) are ``RowCopy`` ranges.
* ``KVCache`` - the tensors: writes K/V of one layer and attends, for a prefill
  of every prompt admitted in a step (one varlen batch) or a decode step over
  the whole batch. Its ``prepare_*`` put the step's integers in the step's
  ``StagingBuffer`` (impls/staging.py), which the caller may have filled with its
  own first, and upload it: one copy per step.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Any, Sequence

import torch

from impls.staging import StagingBuffer


@dataclass(frozen=True)
class RowCopy:
    """Copy ``num_rows`` rows starting at flat row ``src`` to flat row ``dst`` (every layer, K and V)."""

    src: int
    dst: int
    num_rows: int


@dataclass(frozen=True)
class PrefillSpan:
    """Positions ``[start, end)`` of sequence ``seq_id`` to compute; ``[0, start)`` is cached."""

    seq_id: int
    start: int
    end: int

    @property
    def num_tokens(self) -> int:
        return self.end - self.start


def query_slices(spans: Sequence[PrefillSpan]) -> list[slice]:
    """Each span's rows of a prefill batch, whose new tokens are concatenated in span order."""
    out: list[slice] = []
    first = 0
    for span in spans:
        out.append(slice(first, first + span.num_tokens))
        first += span.num_tokens
    return out


@dataclass(frozen=True)
class CacheUsage:
    """Token-slot accounting at one instant. Multiply by KV bytes per token for bytes."""

    capacity_tokens: int  # slots the pool holds
    reserved_tokens: int  # slots held by live sequences (their slots / blocks)
    token_states: int  # slots holding a real token's K/V (shared slots counted once)
    logical_tokens: int  # tokens summed over sequences (what storage without sharing needs)
    fragmentation_tokens: int  # paged: unfilled slots of held blocks (partly filled last blocks)
    reservation_waste_tokens: int  # contiguous: reserved slots not (yet) written
    num_sequences: int
    free_tokens: int  # slots that could still be handed out
    # Variable-size regions: free slots in holes too small for the first waiting request's
    # reservation (impls/region_allocator.py). Fixed-size slots and blocks have none.
    external_fragmentation_tokens: int = 0


@dataclass(frozen=True)
class CacheStats:
    """``CacheUsage`` in bytes (all layers, K and V)."""

    pool_bytes: int
    reserved_bytes: int
    token_bytes: int
    logical_token_bytes: int
    fragmentation_bytes: int
    reservation_waste_bytes: int
    num_sequences: int
    external_fragmentation_bytes: int = 0

    @classmethod
    def from_usage(cls, usage: CacheUsage, bytes_per_token: int) -> "CacheStats":
        return cls(
            pool_bytes=usage.capacity_tokens * bytes_per_token,
            reserved_bytes=usage.reserved_tokens * bytes_per_token,
            token_bytes=usage.token_states * bytes_per_token,
            logical_token_bytes=usage.logical_tokens * bytes_per_token,
            fragmentation_bytes=usage.fragmentation_tokens * bytes_per_token,
            reservation_waste_bytes=usage.reservation_waste_tokens * bytes_per_token,
            num_sequences=usage.num_sequences,
            external_fragmentation_bytes=usage.external_fragmentation_tokens * bytes_per_token,
        )


class KVAllocator(ABC):
    """Bookkeeping of KV slots; check/act pairs so the scheduler never half-admits."""

    cache_hit_tokens: int = 0  # prompt tokens served from a prefix cache over the run

    # ``final_len`` is the sequence's length once it finishes (prompt + every output token),
    # which the scheduler knows (output lengths are fixed). Only allocators that reserve a
    # sequence's whole region at admission use it; the others ignore it.

    @abstractmethod
    def can_admit(self, token_ids: Sequence[int], num_samples: int = 1, final_len: int | None = None) -> bool:
        """Whether a new sequence (and its ``num_samples - 1`` forks) fits now."""

    @abstractmethod
    def admit(self, seq_id: int, token_ids: Sequence[int], final_len: int | None = None) -> int:
        """Reserve slots for ``token_ids``; return how many leading tokens are already cached."""

    def note_waiting(self, final_len: int | None) -> None:
        """The ``final_len`` of the request first in the waiting queue (None: none waits).

        The scheduler notes it after every step. External fragmentation is measured
        against it; allocators without variable-size regions have none and ignore it.
        """

    def cached_prefix_len(self, token_ids: Sequence[int]) -> int:
        """Leading tokens ``admit(token_ids)`` would find cached now (no state change).

        The scheduler charges a prefill's token budget only for the tokens it computes.
        Allocators without a prefix cache find none.
        """
        return 0

    @abstractmethod
    def can_append(self, seq_id: int, num_tokens: int = 1) -> bool: ...

    @abstractmethod
    def append(self, seq_id: int, token_ids: Sequence[int]) -> list[RowCopy]:
        """Reserve slots for the next tokens; return copies the tensors must do first."""

    @abstractmethod
    def fork(self, parent_id: int, child_id: int) -> list[RowCopy]:
        """The child starts with the parent's tokens (shared or copied)."""

    @abstractmethod
    def release(self, seq_id: int) -> None: ...

    @abstractmethod
    def rows(self, seq_id: int, start: int, end: int) -> list[int]:
        """Flat row of each token position in ``[start, end)`` of the sequence."""

    @abstractmethod
    def num_tokens(self, seq_id: int) -> int: ...

    @abstractmethod
    def appendable_without_alloc(self, seq_id: int) -> int:
        """Tokens the sequence can append now with no new slot and no copy (0: the next one needs one).

        The event-driven simulator lets a sequence "ride" that many steps without calling the allocator.
        """

    @abstractmethod
    def usage(self) -> CacheUsage: ...

    def max_sequence_tokens(self) -> int:
        """The longest sequence this allocator can ever hold (prompt and output): the whole pool,
        unless a sequence's space is capped below it (a contiguous slot of max_seq_len)."""
        return self.usage().capacity_tokens

    def usage_plus_written(self, num_tokens: int) -> CacheUsage:
        """``usage()`` once ``num_tokens`` more tokens are appended into slots their sequences already hold.

        Such appends (``appendable_without_alloc``) allocate nothing, so only token states and
        logical tokens grow, and the unwritten reserved slots shrink by as much. Here those are
        reservation waste (slots reserved at admission); an allocator whose unwritten slots count
        as fragmentation (paged) overrides this. The simulator accounts riding tokens this way.
        """
        u = self.usage()
        return replace(u, token_states=u.token_states + num_tokens, logical_tokens=u.logical_tokens + num_tokens,
                       reservation_waste_tokens=u.reservation_waste_tokens - num_tokens)


# Copies that start on a block boundary and fit in one block go block by block up to this
# block length (a paged pool's copy-on-write); longer blocks (a contiguous slab of
# max_seq_len rows) copy only the rows asked for.
WHOLE_BLOCK_COPY_MAX = 128


def apply_row_copies(stores: Sequence[torch.Tensor], copies: Sequence[RowCopy]) -> None:
    """Do ``copies`` in every store (``[blocks, block_len, kv_heads, head_dim]``).

    A copy-on-write copy fills the start of a fresh block, so it is done by block index: the
    whole block is copied, and its rows past ``num_rows`` (beyond the sequence's length, read
    by nothing until written) come along. Other copies go by row index, built without a
    Python loop over rows.
    """
    if not copies:
        return
    device = stores[0].device
    block_len = stores[0].shape[1]
    by_block = [c for c in copies if block_len <= WHOLE_BLOCK_COPY_MAX and c.src % block_len == 0
                and c.dst % block_len == 0 and c.num_rows <= block_len]
    by_row = [c for c in copies if c not in by_block]
    if by_block:
        src_b = torch.tensor([c.src // block_len for c in by_block], device=device)
        dst_b = torch.tensor([c.dst // block_len for c in by_block], device=device)
        for store in stores:
            store[dst_b] = store[src_b]
    if by_row:
        lens = torch.tensor([c.num_rows for c in by_row])
        offsets = torch.arange(int(lens.sum())) - torch.repeat_interleave(torch.cumsum(lens, 0) - lens, lens)
        src = (torch.repeat_interleave(torch.tensor([c.src for c in by_row]), lens) + offsets).to(device)
        dst = (torch.repeat_interleave(torch.tensor([c.dst for c in by_row]), lens) + offsets).to(device)
        for store in stores:
            flat = store.view(-1, *store.shape[-2:])
            flat[dst] = flat[src]


class KVCache(ABC):
    """Tensors of one implementation. The engine only calls these methods.

    Every layer has a K and a V store of ``[num_blocks, block_len, kv_heads, head_dim]``:
    a contiguous slab is ``[slots, max_seq_len, ...]``, a paged pool ``[blocks, block_size, ...]``.
    """

    def __init__(
        self,
        allocator: KVAllocator,
        num_blocks: int,
        block_len: int,
        *,
        num_layers: int,
        num_heads: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        bytes_per_token: int,
    ) -> None:
        self.allocator = allocator
        self.bytes_per_token = bytes_per_token
        self.device = device
        self.scale = head_dim**-0.5
        self.num_heads = num_heads  # query heads (kernels are warmed up with real q shapes)
        shape = (num_blocks, block_len, kv_heads, head_dim)
        # Zeroed, not empty: attention reads rows past a sequence's length (masked out),
        # and a NaN left in recycled memory would survive the mask (0 * NaN = NaN).
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @abstractmethod
    def prepare_prefill(self, spans: Sequence[PrefillSpan], staging: StagingBuffer | None = None) -> Any:
        """Metadata for one forward over every span's new tokens, concatenated in span order.

        Adds the cache's fields to ``staging`` (a new buffer if None) and uploads it.
        """

    @abstractmethod
    def prepare_decode(self, seq_ids: Sequence[int], staging: StagingBuffer | None = None) -> Any:
        """Metadata for one new token per sequence (its slot already appended).

        Adds the cache's fields to ``staging`` (a new buffer if None) and uploads it.
        """

    @abstractmethod
    def forward_layer(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: Any
    ) -> torch.Tensor:
        """Store this layer's new K/V and attend: q ``[T, H, D]`` -> ``[T, H, D]``."""

    def warmup(self) -> None:
        """Compile every kernel variant a run can meet, before anything is timed (default: none)."""

    def counters(self) -> dict[str, int]:
        """Impl-specific event counts over the cache's life, as row columns (none by default)."""
        return {}

    def copy_rows(self, copies: Sequence[RowCopy]) -> None:
        apply_row_copies([*self.k, *self.v], copies)

    def stats(self) -> CacheStats:
        return CacheStats.from_usage(self.allocator.usage(), self.bytes_per_token)
