"""The simulator's time (harness/serving/simulator.py): what prices its steps, the inter-token gaps of a
decode record, and where a jump must end so that no step starts after a request arrives.

``ClockedSteps`` is a part of harness/serving/sim_run.py's run, kept apart by concept: it reads the
run's clock, its time (``now``), the prefills that stalled the running sequences (``_stalls``), and
each step's place since the engine last slept (``since``): a clock with ``after_idle`` factors (a profile
that measured them, harness/serving/after_idle.py) prices a step by its place.
"""

from __future__ import annotations

from typing import Optional, Protocol

from kvbench.harness.serving.after_idle import MIN_IDLE_S, STEADY, AfterIdle
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
    """The clock's side of a run: host-copy time, step prices by their place after a sleep, inter-token gaps, a
    jump's end before an arrival."""

    since: int  # the next step's place since the engine last slept (STEADY before any sleep), or since ``busy``
    busy: bool  # whether ``since`` counts from a busy prefill (after_idle.py), not from a sleep
    after_idle: AfterIdle | None  # the clock's factors (None: every place priced alike)

    def idled(self, seconds: float) -> None:
        """The engine waited ``seconds`` for an arrival with nothing to run: a sleep, if long enough."""
        if seconds >= MIN_IDLE_S:
            self.since, self.busy = 0, False

    def _step_factor(self, kind: str) -> float:
        """The next step's factor (``kind``: prefill, chunk, decode or mixed), and it takes its place: the one
        after it is one later, or the first after a busy prefill."""
        after, k = self.after_idle, self.since
        if after is None:
            self.since += 1
            return 1.0
        factor = after.step_factor(kind, k, self.busy)
        self.since, self.busy = after.next_place(kind, k, self.busy)
        return factor

    def _decode_price(self, batch: int, kv_first: int, steps: int, counted: bool) -> float:
        """``steps`` decode steps from place ``since`` on: the clock's price of each run of places sharing a
        factor, times it (``counted``: the record's, whose steps a profiled clock counts; else a search's)."""
        price = self.clock.decode_s if counted else self.clock.decode_price_s
        after = self.after_idle
        if after is None:
            return price(batch, kv_first, steps)
        total, done = 0.0, 0
        for n, factor in after.segments(self.since, steps, self.busy):
            total += factor * price(batch, kv_first + done * batch, n)
            done += n
        return total

    def _step_prices(self, batch: int, kv_first: int, steps: int, first_place: int, busy: bool = False) -> list[float]:
        """Each of a record's decode steps' own price (uncounted), from place ``first_place`` on (``busy``: counted
        from a busy prefill)."""
        durations = self.clock.decode_steps_s(batch, kv_first, steps)
        after = self.after_idle
        if after is not None:
            durations = [d * after.decode_factor(first_place + j, busy) for j, d in enumerate(durations)]
        return durations

    def _host_s(self, plan: StepPlan) -> float:
        """The plan's host-tier copies: its first step waits for them (cost_model.py host_copy_s)."""
        copies = plan.host_copies
        if not copies or self.clock is None:
            return 0.0
        return self.clock.host_copy_s(len(copies.stores), len(copies.loads), self.alloc.block_size)

    def _gaps(self, batch: int, kv_first: int, steps: int, host_s: float = 0.0,
              durations: Optional[list[float]] = None, first_place: int = STEADY, busy: bool = False) -> None:
        """The inter-token gaps of a decode record: its first step's token follows each sequence's
        previous one across the prefills since the last decode record (a sequence those prefills
        started waited only for the later ones); every later step's gap is that step's duration,
        for all ``batch`` sequences. A preempted sequence's stall shows in its E2EL, not here.
        ``first_place``: the record's first step's place since the engine slept (``busy``: since a busy prefill)."""
        gaps, counts = self.itl_gaps, self.itl_counts
        if durations is None:  # priced, not counted again: the record's decode_s counted these steps
            durations = self._step_prices(batch, kv_first, steps, first_place, busy)
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
        def reached(k: int) -> bool:  # a search: its prices are not steps priced, so not counted
            return self.now + host_s + self._decode_price(batch, kv_first, k, counted=False) >= arrival

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
