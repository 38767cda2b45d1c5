"""The bookkeeping half of the KV-cache interface: pure Python, no tensors.

A ``KVAllocator`` decides which slots of a flat KV store each sequence owns. A *slot*
is one token's place: its K (or V) for one layer, at a flat index (``slot_mapping``
in the kernels). A contiguous slab is a pool whose single block per sequence (its
*lane*) is ``max_seq_len`` slots long, a paged pool has blocks of ``block_size``
slots. Copies (fork, copy-on-write) are ``SlotCopy`` ranges. Admission is planned once
(``plan_admit``) and then carried out (``admit``). The capacity scenario runs these
alone, at 70B scale, and config validation reads the cache kinds without loading torch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

from kvbench.impls.host_tier import NO_HOST_COPIES, HostCopies

_new = object.__new__
_set = object.__setattr__


def frozen_instance(cls: type, fields: dict):
    """``cls(**fields)`` for a frozen dataclass without slots, made without its ``__init__`` (which sets each
    field through ``object.__setattr__``, about three times slower): ``fields`` must name every field, and
    becomes the instance's ``__dict__``. The hot paths that make a plan or a usage per event use it."""
    obj = _new(cls)
    _set(obj, "__dict__", fields)
    return obj


@dataclass(frozen=True)
class SlotCopy:
    """Copy ``num_slots`` slots starting at flat slot ``src`` to flat slot ``dst`` (every layer, K and V)."""

    src: int
    dst: int
    num_slots: int
    pool: int | None = None  # whose blocks, where a cache has several pools (kv_manager=split_pools); None: the one


@dataclass(frozen=True)
class CacheUsage:
    """Slot accounting at one instant, in tokens (the only form the caches report it in).

    A figure in bytes is made where a row is: these times the KV bytes per token (every
    layer, K and V). ``pool``, ``reserved``, ``used`` and ``logical`` become the row columns
    ``kv_pool_bytes``, ``kv_bytes_reserved``, ``kv_bytes_used`` and ``kv_bytes_logical``.
    """

    pool_tokens: int  # slots the pool holds
    reserved_tokens: int  # slots held by live sequences (their lanes, regions or blocks)
    used_tokens: int  # slots holding a real token's K/V (shared slots counted once)
    logical_tokens: int  # tokens summed over sequences (what storage without sharing needs)
    fragmentation_tokens: int  # paged: unfilled slots of held blocks (partly filled last blocks)
    reservation_waste_tokens: int  # contiguous: reserved slots not (yet) written
    num_sequences: int
    free_tokens: int  # slots that could still be handed out
    # Variable-size regions: free slots in holes too small for the first waiting request's
    # reservation (impls/region_allocator.py). Fixed-size lanes and blocks have none.
    external_fragmentation_tokens: int = 0


@dataclass(frozen=True)
class AdmitPlan:
    """One admission, worked out once by ``KVAllocator.plan_admit`` and carried out by ``admit``.

    A plan describes the allocator as it was when planned: it is valid only until the
    allocator's state next changes (any admit, append, fork or release). ``generation``
    records that state, and ``admit`` raises ``StalePlanError`` on a plan of another.
    Allocators extend it with what their ``admit`` needs (a paged pool: its prefix hits).
    """

    token_ids: Sequence[int]
    num_samples: int  # the sequence and its num_samples - 1 forks
    total_len: int | None
    cached_tokens: int  # leading tokens already in the cache (prefix-cache hits): not computed again
    fits: bool  # the sequence and its forks fit now
    generation: int  # the allocator's state counter when planned


class StalePlanError(RuntimeError):
    """``admit`` got a plan made before the allocator's state last changed."""


class KVAllocator(ABC):
    """Bookkeeping of KV slots; check/act pairs so the scheduler never half-admits.

    What a cache kind implements (the abstract methods): admission (``plan_admit``, ``admit``), growth
    (``can_append``, ``append``), ``fork``, ``release``, addressing (``slots``, ``num_tokens``) and its
    memory (``usage``). The rest has defaults: a kind without a host tier, variable-size regions or
    prefix caching needs none of it. The event-driven simulator's fast path (a sequence riding many
    decode steps without a call) is the optional ``FastPath`` (impls/fast_path.py); without it the
    simulator asks the allocator at every step, the same figures, more slowly.
    """

    cache_hit_tokens: int = 0  # prompt tokens served from a prefix cache over the run
    # Whether this pool's cache attends over a padded slab: every decoding sequence's keys up to
    # the batch's longest context, the rest masked (the slab caches' SDPA). Both clocks then
    # price a decode step's attention by batch x longest context, the KV it really reads, not
    # by the sum of contexts (``decode_read_tokens``).
    padded_decode_read: bool = False
    # Counts changes of state (admit, append, fork, release): an ``AdmitPlan`` is valid for one.
    generation: int = 0

    # ``total_len`` is the sequence's length once it finishes (prompt + every output token),
    # which the scheduler knows (output lengths are fixed). Only allocators that reserve a
    # sequence's whole region at admission use it; the others ignore it.

    @abstractmethod
    def plan_admit(self, token_ids: Sequence[int], num_samples: int = 1, total_len: int | None = None) -> AdmitPlan:
        """What admitting ``token_ids`` (and ``num_samples - 1`` forks) would take now; no state change.

        The one place a prompt is examined (a paged pool hashes its blocks here): the
        scheduler reads ``fits`` and ``cached_tokens`` off the plan and hands it to ``admit``.
        """

    @abstractmethod
    def admit(self, seq_id: int, plan: AdmitPlan) -> int:
        """Reserve slots for ``plan``'s tokens; return how many leading tokens are already cached.

        ``plan`` must come from this allocator's ``plan_admit`` with no change of state since
        (``StalePlanError`` otherwise) and must fit (``ValueError`` otherwise).
        """

    def decode_read_tokens(self, lengths: Sequence[int]) -> int:
        """KV tokens a decode step's attention reads for sequences of these lengths (tokens each)."""
        if not lengths:
            return 0
        return len(lengths) * max(lengths) if self.padded_decode_read else sum(lengths)

    def can_admit(self, token_ids: Sequence[int], num_samples: int = 1, total_len: int | None = None) -> bool:
        """Whether a new sequence (and its ``num_samples - 1`` forks) fits now."""
        return self.plan_admit(token_ids, num_samples, total_len).fits

    def _check_plan(self, plan: AdmitPlan) -> None:
        """``admit``'s guard: the plan is of the current state, and it fits."""
        if plan.generation != self.generation:
            raise StalePlanError(f"admission plan of state {plan.generation}, but the allocator is at state "
                                 f"{self.generation}: plan again after any admit, append, fork or release")
        if not plan.fits:
            raise ValueError("admit() of a plan that does not fit (check plan.fits first)")

    def note_waiting(self, total_len: int | None) -> None:
        """The ``total_len`` of the request first in the waiting queue (None: none waits).

        The scheduler notes it after every step. External fragmentation is measured
        against it; allocators without variable-size regions have none and ignore it.
        """

    @abstractmethod
    def can_append(self, seq_id: int, num_tokens: int = 1) -> bool: ...

    @abstractmethod
    def append(self, seq_id: int, token_ids: Sequence[int]) -> list[SlotCopy]:
        """Reserve slots for the next tokens; return copies the tensors must do first."""

    def try_append(self, seq_id: int, token_ids: Sequence[int]) -> list[SlotCopy] | None:
        """``append`` when ``can_append`` allows it, else None with nothing changed: the scheduler's
        check and act in one call (the block manager does both in one pass)."""
        if not self.can_append(seq_id, len(token_ids)):
            return None
        return self.append(seq_id, token_ids)

    def swap_out(self, seq_id: int) -> bool:
        """Preempt by swap (``preemption=swap``): the sequence's KV to the host tier, then released.
        False, nothing done, where the allocator does not swap or its tier lacks room: recompute it."""
        return False

    def can_swap_in(self, seq_id: int, watermark: bool = True) -> bool:
        raise NotImplementedError(f"{type(self).__name__} swaps nothing out")

    def swap_in(self, seq_id: int) -> None:
        """A swapped-out sequence's KV back, as it was; its copies come with the step's host copies."""
        raise NotImplementedError(f"{type(self).__name__} swaps nothing out")

    def take_host_copies(self) -> HostCopies:
        """Copies between the device pool and a host tier (impls/host_tier.py) queued since the last
        call: the scheduler hands them to the step. None without a host tier."""
        return NO_HOST_COPIES

    @abstractmethod
    def fork(self, parent_id: int, child_id: int) -> list[SlotCopy]:
        """The child starts with the parent's tokens (shared or copied)."""

    @abstractmethod
    def release(self, seq_id: int) -> None: ...

    def drop_unwritten(self, seq_id: int, written: int) -> None:
        """Chunked prefill: ``seq_id`` leaves with K/V only in its first ``written`` slots; the blocks past
        them that only it holds must not serve later prefix hits (default: nothing is cached)."""

    @abstractmethod
    def slots(self, seq_id: int, start: int, end: int) -> list[int]:
        """Flat slot of each token position in ``[start, end)`` of the sequence."""

    @abstractmethod
    def num_tokens(self, seq_id: int) -> int: ...

    @abstractmethod
    def usage(self) -> CacheUsage: ...

    def max_sequence_tokens(self) -> int:
        """The longest sequence this allocator can ever hold (prompt and output): the whole pool,
        unless a sequence's space is capped below it (a contiguous cache's lane of max_seq_len)."""
        return self.usage().pool_tokens
