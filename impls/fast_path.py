"""The event-driven simulator's fast path: what an allocator may add to the narrow ``KVAllocator``.

The simulator (harness/serving/simulator.py) lets a running sequence *ride* decode steps without
calling the allocator while its next tokens need no memory and fill no block anyone could look up;
it appends the owed tokens in one call later, and meanwhile counts them in the memory figures
(``usage_plus_written``). An allocator offers that by being a ``FastPath``: it implements
``appendable_without_alloc`` and inherits the rest (or overrides it, faster). One that is not gets
``StepByStep``, which makes every sequence due at every step: the same figures, more calls.

This module depends on the narrow interface (impls/allocator.py), never the other way round.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import replace
from typing import Callable

from kvbench.impls.allocator import CacheUsage, KVAllocator


class FastPath(KVAllocator):
    """A ``KVAllocator`` whose sequences can ride: one method to implement, the rest inherited."""

    # Set by the event-driven simulator where an allocator supports it: called with a running sequence's id
    # when something is about to look at blocks that sequence filled silently, so that the simulator brings
    # its owed tokens in first (impls/prefix_chain.py calls it before it hashes a pending chain).
    on_expose: Callable[[int], None] | None = None

    @abstractmethod
    def appendable_without_alloc(self, seq_id: int) -> int:
        """Tokens the sequence can append now with no new slot and no copy (0: the next one needs one).

        The event-driven simulator lets a sequence "ride" that many steps without calling the allocator.
        """

    def fill_is_silent(self, seq_id: int) -> bool:
        """True when the token that fills the sequence's last block changes nothing another sequence or
        request could see before the sequence next needs memory (no prefix-cache entry a lookup could hit).
        The event-driven simulator then lets the sequence ride through that fill, not stop at it."""
        return False

    def riding_steps(self, seq_id: int) -> int:
        """Decode steps until the sequence's next one the allocator must see: the one that needs memory
        (a new slot or a copy), else the one that fills its block, unless that fill is silent (at least 1)."""
        run = self.appendable_without_alloc(seq_id)
        return run + 1 if run and self.fill_is_silent(seq_id) else run or 1

    def usage_plus_written(self, num_tokens: int) -> CacheUsage:
        """``usage()`` once ``num_tokens`` more tokens fill slots their sequences already hold (no allocation).

        Here the filled slots were reservation waste; paged, where they are fragmentation, overrides this.
        """
        u = self.usage()
        return replace(u, used_tokens=u.used_tokens + num_tokens, logical_tokens=u.logical_tokens + num_tokens,
                       reservation_waste_tokens=u.reservation_waste_tokens - num_tokens)


class StepByStep:
    """The fast path's answers for an allocator without one: every sequence is due at every decode step,
    so it never owes a token when the figures are read. Only what the simulator asks is here."""

    __slots__ = ("alloc",)

    def __init__(self, alloc: KVAllocator) -> None:
        self.alloc = alloc

    def appendable_without_alloc(self, seq_id: int) -> int:
        return 0

    def riding_steps(self, seq_id: int) -> int:
        return 1

    def usage_plus_written(self, num_tokens: int) -> CacheUsage:
        assert num_tokens == 0, "a sequence that rides no step owes no token"
        return self.alloc.usage()


def fast_path(alloc: KVAllocator) -> FastPath | StepByStep:
    """``alloc`` itself where it has the fast path, else its step-by-step stand-in."""
    return alloc if isinstance(alloc, FastPath) else StepByStep(alloc)
