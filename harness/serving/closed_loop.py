"""Closed-loop arrivals: a user's next turn arrives a think time after its previous answer finished.

workload.kind=multi_turn (harness/serving/conversations.py) fixes every turn's prompt in advance; when
each later turn arrives depends on the run: on its predecessor's ``finish_s`` on the run's clock (wall
or simulated) plus the turn's think time. First turns arrive at the ``arrival`` process's times. A turn
that is rejected (it never fits) ends its conversation: nothing waits on it. Without a clock (the
capacity scenario's memory-only runs) there is no time to think in: a turn arrives at t=0, as soon as
its predecessor finished.

The turns after a rejected one are never sent, on either clock; ``unsent_note`` says how many in the
row, whose ``prefix_hit_rate`` counts their prompt tokens as hitting nothing.
"""

from __future__ import annotations

import heapq
from dataclasses import replace
from typing import Optional, Sequence as Seq

from kvbench.harness.serving.sequence import Sequence
from kvbench.harness.serving.workload import Request


class ClosedLoopSource:
    def __init__(self, requests: Seq[Request], conversations: Seq[Seq[int]], think_s: Seq[float],
                 first_arrivals: Seq[float]) -> None:
        """``conversations[u]``: user u's request ids in turn order (ids index ``requests``);
        ``think_s[r]``: seconds between request r's predecessor finishing and r arriving;
        ``first_arrivals[u]``: when user u's first turn arrives."""
        if len(first_arrivals) != len(conversations):
            raise ValueError(f"{len(first_arrivals)} first arrivals for {len(conversations)} conversations")
        self._requests, self._think = requests, think_s
        self._successor: dict[int, int] = {}
        for ids in conversations:
            for a, b in zip(ids, ids[1:]):
                self._successor[a] = b
        # (arrival, request id): ties go by id, so the order is the same on every run
        self._pending = [(float(t), ids[0]) for ids, t in zip(conversations, first_arrivals) if ids]
        heapq.heapify(self._pending)
        self.released: list[Request] = []  # every request handed out, with its arrival time, in order

    def due(self, now: float) -> list[Request]:
        out = []
        while self._pending and self._pending[0][0] <= now:
            t, rid = heapq.heappop(self._pending)
            req = replace(self._requests[rid], arrival_s=t)
            out.append(req)
        self.released += out
        return out

    def next_arrival(self) -> Optional[float]:
        return self._pending[0][0] if self._pending else None

    def finished(self, seqs: Seq[Sequence]) -> None:
        for s in seqs:
            nxt = self._successor.get(s.request_id)
            if nxt is None or s.sample:  # kind=multi_turn has n=1: sample 0 is the request
                continue
            at = 0.0 if s.finish_s is None else s.finish_s + self._think[nxt]
            heapq.heappush(self._pending, (at, nxt))


def unsent_note(total: int, sent: int) -> str | None:
    """The row's note when a run sent ``sent`` of its ``total`` turns (None: all): the others followed a
    rejected turn of their conversation (one longer than the whole KV pool holds), which ended it. The
    rate counts their prompts (over every prompt token of the workload, as the ideal does), so a pool
    too small for the later turns shows as a low hit rate, not only as rejections."""
    if sent >= total:
        return None
    return (f"{total - sent} of {total} turns not sent (an earlier turn of their conversation was rejected): "
            "prefix_hit_rate counts their prompt tokens as not hit")
