"""Where a run's requests come from, step by step: both clocks ask a source what has arrived.

The decode engine (wall clock) and the simulator (simulated clock) ask the source, before each step,
for the requests due by now, and tell it which sequences finished after each step. An open-loop
source knows every arrival in advance; a closed-loop one (harness/serving/closed_loop.py) learns a
request's arrival only when what it waits for has finished.
"""

from __future__ import annotations

from typing import Optional, Protocol, Sequence as Seq

from kvbench.harness.serving.sequence import Sequence
from kvbench.harness.serving.workload import Request


class RequestSource(Protocol):
    def due(self, now: float) -> list[Request]:
        """The requests that arrived by ``now`` and were not handed out yet, in arrival order."""
        ...

    def next_arrival(self) -> Optional[float]:
        """The earliest arrival not handed out yet; None when none is known (yet)."""
        ...

    def finished(self, seqs: Seq[Sequence]) -> None:
        """Sequences that made their last token in the step just done (``finish_s`` stamped)."""
        ...


class OpenLoopSource:
    """A fixed list: each request at its ``arrival_s`` (``times`` overrides them), ties in list order."""

    def __init__(self, requests: Seq[Request], times: Optional[Seq[float]] = None) -> None:
        self._times = times if times is not None else [r.arrival_s for r in requests]
        self._requests = requests
        self._order = sorted(range(len(requests)), key=self._times.__getitem__)  # stable
        self._next = 0

    def due(self, now: float) -> list[Request]:
        order, times, start = self._order, self._times, self._next
        end = start
        while end < len(order) and times[order[end]] <= now:
            end += 1
        self._next = end
        return [self._requests[i] for i in order[start:end]]

    def next_arrival(self) -> Optional[float]:
        return self._times[self._order[self._next]] if self._next < len(self._order) else None

    def finished(self, seqs: Seq[Sequence]) -> None:
        pass  # open loop: finishes change no arrival


def tell_rejected(source: RequestSource, rejected: Seq[tuple[Sequence, str]], told: int, now: float) -> int:
    """Tell ``source`` of the requests rejected since the first ``told`` of the scheduler's ``rejected`` list, if it
    listens (a client's cap frees their slots: harness/serving/client_cap.py); returns how many are told now."""
    hook = getattr(source, "rejected", None)
    if hook is not None and len(rejected) > told:
        hook([seq for seq, _ in rejected[told:]], now)
    return len(rejected)
