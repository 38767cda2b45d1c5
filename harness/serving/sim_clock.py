"""The simulator's time (harness/serving/simulator.py): what prices its steps, the inter-token gaps of a
decode record, and where a jump must end so that no step starts after a request arrives.

``ClockedSteps`` is a part of harness/serving/sim_run.py's run, kept apart by concept: it reads the
run's clock, its time (``now``) and the prefills that stalled the running sequences (``_stalls``).
"""

from __future__ import annotations

from typing import Optional, Protocol

from kvbench.harness.serving.layer_terms import Spans
from kvbench.harness.serving.scheduler import StepPlan


class StepClock(Protocol):
    """Prices steps (harness/serving/cost_model.py's ``CostModel``)."""

    def prefill_s(self, tokens: int, prompts: int = 1, spans: Spans = ()) -> float:
        """``spans``: the positions computed of each prompt (harness/serving/layer_terms.py), for its attention."""

    def decode_s(self, batch: int, kv_tokens_read: int, steps: int = 1) -> float:
        """The price of a record's steps (a profiled clock counts those outside its profile)."""

    def decode_price_s(self, batch: int, kv_tokens_read: int, steps: int = 1) -> float:
        """``decode_s``, counting nothing: asked while a jump's end is searched."""

    def decode_steps_s(self, batch: int, kv_tokens_read: int, steps: int) -> list[float]:
        """Each step's own price, ``decode_price_s(batch, kv_tokens_read + j*batch)`` for j < steps."""

    def mixed_s(self, tokens: int, batch: int, kv_tokens_read: int, spans: Spans = ()) -> float: ...

    def host_copy_s(self, stores: int, loads: int, block_tokens: int) -> float: ...


class ClockedSteps:
    """The clock's side of a run: host-copy time, inter-token gaps, a jump's end before an arrival."""

    def _host_s(self, plan: StepPlan) -> float:
        """The plan's host-tier copies: its first step waits for them (cost_model.py host_copy_s)."""
        copies = plan.host_copies
        if not copies or self.clock is None:
            return 0.0
        return self.clock.host_copy_s(len(copies.stores), len(copies.loads), self.alloc.block_size)

    def _gaps(self, batch: int, kv_first: int, steps: int, host_s: float = 0.0,
              durations: Optional[list[float]] = None) -> None:
        """The inter-token gaps of a decode record: its first step's token follows each sequence's
        previous one across the prefills since the last decode record (a sequence those prefills
        started waited only for the later ones); every later step's gap is that step's duration,
        for all ``batch`` sequences. A preempted sequence's stall shows in its E2EL, not here."""
        clock, gaps, counts = self.clock, self.itl_gaps, self.itl_counts
        if durations is None:  # priced, not counted again: the record's decode_s counted these steps
            durations = clock.decode_steps_s(batch, kv_first, steps)
            durations[0] += host_s
        started = min(batch, sum(n for _, n in self._stalls))
        stall = sum(d for d, _ in self._stalls)
        if batch - started:
            gaps.append(durations[0] + stall)
            counts.append(batch - started)
        for i, (d, n) in enumerate(self._stalls):  # those started by prefill i wait for the prefills after it
            n = min(n, started)
            started -= n
            if n:
                gaps.append(durations[0] + sum(d2 for d2, _ in self._stalls[i + 1:]))
                counts.append(n)
        self._stalls.clear()
        for d in durations[1:]:
            gaps.append(d)
            counts.append(batch)

    def _until(self, arrival: float, batch: int, kv_first: int, most: int, host_s: float = 0.0) -> int:
        """Fewest steps (<= ``most``) after which the clock has reached ``arrival``: no later step
        of the jump may start at or after it, since that step would admit it."""
        price = self.clock.decode_price_s  # a search: its prices are not steps priced, so not counted

        def reached(k: int) -> bool:
            return self.now + host_s + price(batch, kv_first, k) >= arrival

        if not reached(most):
            return most
        lo, hi = 1, most
        while lo < hi:
            mid = (lo + hi) // 2
            if reached(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo
