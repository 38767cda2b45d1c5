"""A client that keeps at most C requests in flight: ``arrival.max_concurrency=C``, as ``vllm bench serve
--max-concurrency C`` runs a benchmark.

vLLM's client (vllm/benchmarks/serve.py) makes every request at its arrival time (all at once for an infinite
rate), and each waits on a semaphore of C before it is sent: request C+1 goes out when one of the first C has
come back whole. That is a closed loop, and it is not ``batch=C``: the engine's cap frees a slot the moment a
sequence's last step ends, where the client's frees it when the last token has reached the client, after the
server's front-end work (the engine profile's ``frontend_ms``, which the clock adds to a request's first token
and its finish: harness/serving/sim_run.py). A request's latencies start when the client sends it, which is its
arrival here, so TTFT and E2EL are the ones the client measures.

A request goes out at ``max(its own arrival, the time a slot frees)``, in arrival order; a request with n > 1
samples holds its slot until the last sample is back. A request the engine rejects (it can never fit) frees its
slot at once: vLLM returns its error as soon as the request is refused.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import replace
from typing import Optional, Sequence as Seq

from kvbench.harness.serving.sequence import Sequence
from kvbench.harness.serving.workload import Request


class CappedClientSource:
    """``requests`` (each at its ``arrival_s``) sent by a client that holds at most ``cap`` in flight."""

    def __init__(self, requests: Seq[Request], cap: int) -> None:
        if cap < 1:
            raise ValueError(f"a client cap of {cap} requests in flight: it must be at least 1")
        order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)  # stable: ties in list order
        self._waiting = deque(requests[i] for i in order)
        self._ready: list[tuple[float, int, Request]] = []  # (send time, sequence number, request)
        self._sent = 0
        self._samples_left: dict[int, int] = {}  # request id -> samples not back yet
        self.released: list[Request] = []  # every request sent, with its send time as arrival_s, in order
        for _ in range(min(cap, len(self._waiting))):
            self._send(0.0)

    def _send(self, free_at: float) -> None:
        """The next waiting request takes the slot that frees at ``free_at``."""
        req = self._waiting.popleft()
        at = max(req.arrival_s, free_at)
        heapq.heappush(self._ready, (at, self._sent, req))
        self._sent += 1

    def due(self, now: float) -> list[Request]:
        out = []
        while self._ready and self._ready[0][0] <= now:
            at, _, req = heapq.heappop(self._ready)
            sent = req if req.arrival_s == at else replace(req, arrival_s=at)
            self._samples_left[sent.request_id] = sent.n
            out.append(sent)
        self.released += out
        return out

    def next_arrival(self) -> Optional[float]:
        return self._ready[0][0] if self._ready else None

    def finished(self, seqs: Seq[Sequence]) -> None:
        for s in seqs:
            self._back(s.request_id, 0.0 if s.finish_s is None else s.finish_s)

    def rejected(self, seqs: Seq[Sequence], now: float) -> None:
        """Requests the engine refused at ``now`` (never fitting; one sequence a request, its samples never
        forked): their slots free at once."""
        for s in seqs:
            self._back(s.request_id, now, whole=True)

    def _back(self, request_id: int, at: float, whole: bool = False) -> None:
        left = 0 if whole else self._samples_left.get(request_id, 0) - 1
        if left > 0:
            self._samples_left[request_id] = left
            return
        self._samples_left.pop(request_id, None)
        if self._waiting:
            self._send(at)
