"""The scheduler and an allocator run without tensors, event by event: memory (and, with a clock, time).

Shared by the capacity scenario and the max-concurrency search's bookkeeping probes.
Every sequence "generates" a synthetic token per step (a fixed function of its request
and sample). The figures are exactly those of running ``Scheduler`` one step at a time
(tests/unit/harness/serving/test_simulator.py checks it against that loop), but the work follows events, not
batch x steps:

- A running sequence is *due* at the decode step whose token fills its block (which then
  enters the prefix cache) and at the one whose token needs memory (a new block or a
  copy-on-write: ``appendable_without_alloc`` has run out). Only due sequences go to the
  scheduler, in running order, which checks, appends and preempts them exactly as in a
  real decode step; so every allocation and every prefix-cache entry happens in the same
  order as step by step.
- A fill that nobody can see (``FastPath.fill_is_silent``: no prefix caching, or a chain that only
  its own sequence holds, hashed lazily) is not an event: the sequence rides through it to the step
  that needs memory, which appends the fill's tokens with its own. If a lookup is about to reach such a
  chain (a waiting prompt hits its first block), the allocator calls ``on_expose`` first, and the
  sequence's owed tokens come in before the lookup reads the chain; from then on its fills are events.
  Half the events of a long decode at scale (issue 25's 100,000 requests: 3.3 million appends to 1.7).
- Between its due steps a sequence *rides*: its tokens, which need no memory and fill no
  block, are owed, not appended. It appends them with its next due token, or when it
  finishes or is preempted; meanwhile the memory figures count them (``usage_plus_written``).
- Steps where nobody is due, finishes or arrives decide nothing new, so one ``StepRecord``
  stands for ``steps`` of them (a jump); a clock prices the jump in closed form.
- Under chunked prefill a step that computes prompt chunks (with the decodes: a mixed step) is one
  step of its own, never part of a jump; the sequences whose last chunk it computed ride from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence as Seq

from kvbench.harness.serving.request_source import OpenLoopSource, RequestSource, tell_rejected
from kvbench.harness.serving.scheduler import StepPlan
from kvbench.harness.serving.served_run import ServedRun
from kvbench.harness.serving.sequence import Sequence
from kvbench.harness.serving.sim_clock import StepClock
from kvbench.harness.serving.sim_run import Run, StepObserver
from kvbench.harness.serving.timeline import StepRecord
from kvbench.harness.serving.workload import Request, gc_paused
from kvbench.impls.allocator import KVAllocator


@dataclass
class Simulation(ServedRun):
    """A simulated run: the record the decode engine's run shares (harness/serving/served_run.py; its
    ``sequences`` only with a clock, timed, and ``idle_s`` simulated time), and its own figures."""

    finished: int = 0
    # With a clock: every inter-token gap, as (gap seconds, how many sequences had it); see sim_run.py Run.decode.
    itl: tuple[list[float], list[int]] = field(default_factory=lambda: ([], []))


def simulate(
    allocator: KVAllocator,
    requests: list[Request],
    max_num_seqs: int,
    max_num_batched_tokens: int,
    vocab: int,
    bytes_per_token: int,
    clock: Optional[StepClock] = None,
    arrival_s: Optional[Seq[float]] = None,
    observer: Optional[StepObserver] = None,
    source: Optional[RequestSource] = None,
    chunked_prefill: bool = False,
) -> Simulation:
    """Run ``requests`` to completion. With ``clock`` every record is priced and ``arrival_s``
    (seconds, one per request) holds each request back until then; ``observer`` sees every
    record with the scheduler's plan and the sequences that finished in it. ``source``: the
    requests come from it instead (harness/serving/request_source.py; e.g. a closed loop)."""
    if arrival_s is not None and clock is None:
        raise ValueError("arrival times need a clock to compare them with")
    if source is not None and (requests or arrival_s is not None):
        raise ValueError("requests come from the source or from the list, not both")
    # The run allocates millions of small objects and makes no reference cycles: the cyclic
    # collector would only rescan every live request again and again.
    with gc_paused():
        if source is None:  # a burst: all at once, in list order
            source = OpenLoopSource(requests, arrival_s if arrival_s is not None else [0.0] * len(requests))
        return _simulate(allocator, source, max_num_seqs, max_num_batched_tokens, vocab, bytes_per_token,
                         clock, observer, chunked_prefill)


def _told(source: RequestSource, observer: Optional[StepObserver]) -> StepObserver:
    """An observer that tells ``source`` of each record's finished sequences, then calls ``observer``."""
    def observe(rec: StepRecord, plan: StepPlan, finished: list[Sequence]) -> None:
        if finished:
            source.finished(finished)
        if observer is not None:
            observer(rec, plan, finished)
    return observe


def _simulate(allocator, source, max_num_seqs, max_num_batched_tokens, vocab, bytes_per_token, clock,
              observer, chunked_prefill=False) -> Simulation:
    run = Run(allocator, max_num_seqs, max_num_batched_tokens, vocab, bytes_per_token, clock, _told(source, observer),
              chunked_prefill)
    sched = run.sched
    told = 0  # rejections the source was told of
    while True:
        for req in source.due(run.now):
            sched.add_request(req)
        next_arrival = source.next_arrival()
        if sched.done:
            if next_arrival is None:
                break
            run.idle_s += next_arrival - run.now
            run.idled(next_arrival - run.now)
            run.now = next_arrival  # idle until the next request
            continue
        run.listed = []
        plan = sched.schedule(1, candidates=run.candidates)  # asked once admissions are done, if it decodes
        if plan.chunks or (plan.resumed and plan.decodes):  # chunked prefill: a step of its own
            run.mixed(plan, run.listed)
        elif plan.is_prefill:
            run.prefill(plan)
        else:
            run.decode(plan, run.listed, next_arrival)
        told = tell_rejected(source, sched.rejected, told, run.now)
    if run.ride is allocator:  # a fast path's: the run is over, nothing owes tokens any more
        allocator.on_expose = None
    timed = clock is not None
    return Simulation(finished=len(sched.finished), itl=(run.itl_gaps, run.itl_counts), prefill_steps=run.prefill_steps,
                      # the last response leaves the front-end after the engine's last step (sim_run.py frontend_s)
                      records=run.records, elapsed_s=run.now + run.frontend_s if timed else None,
                      cache_hit_tokens=allocator.cache_hit_tokens,
                      counters=getattr(allocator, "host_counters", dict)(), peaks=run.peaks, peak_running=sched.peak_running,
                      max_concurrency=sched.max_concurrency, preemptions=sched.num_preemptions,
                      rejected=sched.rejected, decode_steps=run.done, idle_s=run.idle_s,
                      sequences=list(sched.finished) if timed else [])
