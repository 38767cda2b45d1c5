"""The workload a job serves: the drawn requests with their arrival times, their digest, the closed-loop
source that decides a later turn's arrival, and the ideal prefix-cache hit rate. Drawn on first use, once."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Callable

from kvbench.harness.config import Config
from kvbench.harness.serving.arrivals import arrival_times, ignored_rate_note
from kvbench.harness.serving.workload import Request, Workload, draw_workload, workload_digest

if TYPE_CHECKING:
    from kvbench.harness.serving.client_cap import CappedClientSource
    from kvbench.harness.serving.closed_loop import ClosedLoopSource


@dataclass
class JobWorkload:
    cfg: Config
    memo: dict = field(default_factory=dict)  # the job's (JobRun.memo): the ideal hit rate, once per job
    draw: Callable[..., Workload] = draw_workload  # harness/serving/workload.py's, unless the job wires another

    @cached_property
    def drawn(self) -> Workload:
        w = self.cfg.workload
        return self.draw(w, w.num_requests, self.cfg.model.vocab_size, self.cfg.max_seq_len, self.cfg.seed,
                         model_path=self.cfg.model.path)

    @cached_property
    def requests(self) -> list[Request]:
        """The workload's requests, each with its arrival time (``cfg.arrival``). A closed loop
        (workload.kind=multi_turn): the arrival process times each user's first turn; a later turn's
        arrival is decided by the run (``request_source``), so it stays 0 here."""
        wl = self.drawn
        if wl.conversations is not None:
            times = arrival_times(self.cfg.arrival, len(wl.conversations), self.cfg.seed)
            first = {ids[0]: t for ids, t in zip(wl.conversations, times)}
            return [replace(r, arrival_s=first.get(r.request_id, 0.0)) for r in wl.requests]
        times = arrival_times(self.cfg.arrival, len(wl.requests), self.cfg.seed, wl.trace_arrivals)
        if not any(times):  # a burst: the drawn requests (each arrives at 0) as they are
            return list(wl.requests)
        # Request(...) rather than dataclasses.replace, which reads every field by name: 0.4 s per 100,000.
        return [Request(r.request_id, r.prompt_ids, r.output_len, r.n, t) for r, t in zip(wl.requests, times)]

    @cached_property
    def digest(self) -> str:
        """``workload_digest(requests)``: the one drawing made, while every request arrives at once (an arrival
        at 0 adds nothing to a request's record)."""
        made = self.drawn.digest
        if made is not None and not any(r.arrival_s for r in self.requests):
            return made
        return workload_digest(self.requests)

    def request_source(self) -> ClosedLoopSource | CappedClientSource | None:
        """A fresh closed-loop source for one run of the requests: the turns of conversations
        (harness/serving/closed_loop.py), or a client's cap on requests in flight (``arrival.max_concurrency``,
        harness/serving/client_cap.py); None where every arrival is known in advance (the run takes
        ``requests`` as they are)."""
        wl = self.drawn
        cap = self.cfg.arrival.max_concurrency
        if cap is not None and wl.conversations is None:
            from kvbench.harness.serving.client_cap import CappedClientSource

            return CappedClientSource(self.requests, cap)
        if wl.conversations is None:
            return None
        from kvbench.harness.serving.closed_loop import ClosedLoopSource

        reqs = self.requests
        return ClosedLoopSource(reqs, wl.conversations, wl.think_s, [reqs[ids[0]].arrival_s for ids in wl.conversations])

    def ideal_hit_rate(self) -> float | None:
        """The workload's prefix-cache hit rate with an unbounded cache (harness/serving/prefix_reuse.py),
        over the requests in arrival order (a closed loop's request order is one it can take); once per job."""
        if "ideal_hit_rate" not in self.memo:
            from kvbench.harness.serving.prefix_reuse import ideal_prefix_reuse

            order = sorted(self.requests, key=lambda r: (r.arrival_s, r.request_id))
            if self.drawn.conversations is not None:
                order = self.requests  # turn by turn: every user's turns in order
            self.memo["ideal_hit_rate"] = ideal_prefix_reuse((r.prompt_ids for r in order), self.cfg.block_size).hit_rate
        return self.memo["ideal_hit_rate"]

    @property
    def notes(self) -> list[str]:
        """What drawing the requests and their arrival times changed (clipped lengths) or ignored
        (an ``arrival.rate`` that the arrival process does not read), for the rows' ``notes``."""
        rate_note = ignored_rate_note(self.cfg.arrival)
        return list(self.drawn.notes) + ([rate_note] if rate_note else [])
