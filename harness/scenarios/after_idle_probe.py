"""scenario=profile's after-idle probe: what the steps after the engine slept cost against the grid's prices.

The grid (harness/scenarios/profile_grid.py) times each point as the first steps of a fresh burst; a serving
engine also sleeps between arrivals and runs long busy stretches, and its steps cost more just after a sleep and
less deep into a stretch (harness/serving/after_idle.py has the figures). The probe serves what a wall run does
after a sleep: one engine, built once, sleeps ``SLEEP_S``, then serves one prompt of the workload's mean length
for ``PROBE_STEPS`` decode steps, ``RUNS`` times a pass (after one untimed run: the engine's first). Each step is
timed as the grid times its points, from the end of the step before (the prefill from when the engine woke), so
that its ratio to the grid's price of its shape, over the same ratio of the probe's later steps, is the factor
of its place (harness/serving/after_idle.py ``fitted``). Then, with no sleep, a second prompt arrives while the first
sequence decodes: its prefill is a busy one, and the ``BUSY_STEPS`` decode steps of both sequences after it give
the busy curve's places (after_idle.py ``AfterIdle.busy``). Nothing here is a scenario
(harness/scenarios/__init__.py ``NOT_SCENARIOS``).
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvbench.harness.config import ImplConfig
from kvbench.harness.serving.after_idle import DECODE_BINS, REFERENCE_FROM, fitted
from kvbench.harness.serving.request import Request

if TYPE_CHECKING:  # reading a config imports this module; running it loads torch
    from kvbench.harness.scenarios.compute import Compute
    from kvbench.harness.scenarios.job_run import JobRun
    from kvbench.harness.serving.profiled_clock import ProfiledClock

# One sleep: the wall runs' prefills ran at their slowest from a 10-30 ms wait on (after_idle.py); at the
# validation's 5-10 req/s most waits are longer.
SLEEP_S = 0.05
# Decode steps after each sleep: the bins, then the reference the factors are relative to (28 steps a sleep).
PROBE_STEPS = 32
# Decode steps of both sequences after the busy prefill: its bins, then a few of the reference.
BUSY_STEPS = 8
RUNS = 3  # sleeps a pass (three passes: 9 samples of each early place, 261 of the reference; the busy curve's 45)


@dataclass(frozen=True)
class Sample:
    """One probed step: its kind, place since the sleep (or since the busy prefill: ``busy``), shape (as the clock
    prices it) and seconds."""

    kind: str  # prefill | decode
    place: int
    tokens: int  # prefill: prompt tokens computed
    batch: int
    kv_tokens_read: int  # decode: KV tokens its attention read, over the batch
    seconds: float
    busy: bool = False


def probe_steps(job: JobRun, prompt_len: int) -> tuple[int, int]:
    """Decode steps a probe's first sequence runs before the second prompt arrives (``PROBE_STEPS``), and both
    after it (``BUSY_STEPS``), as many as ``max_seq_len`` leaves the first."""
    room = max(0, job.cfg.max_seq_len - prompt_len - 1)
    first = min(PROBE_STEPS, room)
    return first, min(BUSY_STEPS, room - first)


class _SecondAfter:
    """The probe's request source: the first request at once, the second once the engine has run the first's
    prefill and ``steps`` decode steps (the engine asks ``due`` once a step), so that it arrives while the first
    decodes and the engine never sleeps for it."""

    def __init__(self, first: Request, second: Request | None, steps: int) -> None:
        self._pending = [first] + ([second] if second is not None else [])
        self._asked, self._steps = 0, steps

    def due(self, now: float) -> list[Request]:
        self._asked += 1
        if self._asked == 1 or (self._asked == self._steps + 2 and len(self._pending) == 1):
            return [self._pending.pop(0)]
        return []

    def next_arrival(self) -> float | None:
        return 0.0 if self._pending else None

    def finished(self, seqs: list) -> None:
        pass  # finishes change no arrival


def probe(job: JobRun, compute: Compute, impl: ImplConfig, prompt_len: int, salt: int,
          runs: int = RUNS, sleep_s: float = SLEEP_S) -> list[Sample]:
    """``runs`` sleeps, each followed by one prompt of ``prompt_len`` tokens served for the probe's decode
    steps, and a second prompt arriving while it decodes (``probe_steps``), on one engine (its first run
    untimed); every step as a ``Sample``."""
    from kvbench.harness.kv.factory import build_cache
    from kvbench.harness.scenarios.profile_grid import _prompts
    from kvbench.harness.serving.engine import Engine

    steps, busy_steps = probe_steps(job, prompt_len)
    if steps < 1:
        return []
    cfg = copy.deepcopy(job.cfg)
    cfg.batch = 2
    slots = (math.ceil(max(cfg.max_seq_len, prompt_len + steps + busy_steps + 1) / cfg.block_size) + 1) * cfg.block_size
    cache = build_cache(impl, cfg, int(2 * slots * job.bytes_per_token * 1.1), job.device)
    engine = Engine(compute.model, cache, 2, cfg.max_num_batched_tokens, sync=compute.sync)
    out: list[Sample] = []
    for i in range(runs + 1):
        first, second = _prompts(job, 2, prompt_len, 7_000_000 + salt * (runs + 1) + i)
        later = Request(2 * i + 1, second, busy_steps + 1, 1) if busy_steps else None
        time.sleep(sleep_s)
        result = engine.run([], source=_SecondAfter(Request(2 * i, first, steps + busy_steps + 1, 1), later, steps))
        if result.preemptions or result.rejected:
            raise RuntimeError("the after-idle probe's sequences were preempted or rejected: its cache was sized "
                               "too small")
        if i == 0:
            continue  # the engine's first run: its first calls, not a sleep's
        before, place, busy = None, 0, False
        for rec in result.records:
            seconds = rec.duration_s if before is None else rec.t_s - before
            if before is not None and rec.kind == "prefill":  # the second prompt's: a busy prefill
                place, busy = 0, True
            before = rec.t_s
            out.append(Sample(rec.kind, place, rec.tokens, rec.batch, int(rec.kv_tokens_read or 0), seconds, busy))
            place += 1
    return out


def after_idle_rows(impl: str, passes: list[tuple[list[Sample], ProfiledClock]]) -> list[dict]:
    """The profile table's after-idle rows from each pass's probe, each step over the price its own pass's grid
    gives its shape (a clock of that pass's points, without these factors: the machine's speed moved 5-30%
    between one pass and the next on the 2-core CPUs, and a factor is a ratio within one moment of it): place 0
    (the prefill), each decode bin's first place and the reference's (factor 1), with the factor, the bin's
    median step and its samples.
    None at all where a bin has no sample or a factor is not a cache's (after_idle.py ``fitted``): the profile
    then prices every step as its grid does."""
    from kvbench.harness.serving.after_idle import AfterIdle

    def ratio(s: Sample, clock: ProfiledClock) -> float:
        price = (clock.prefill_s(s.tokens) if s.kind == "prefill"
                 else clock.decode_price_s(s.batch, s.kv_tokens_read))
        return s.seconds / price if price > 0 else math.inf

    samples = [s for got, _ in passes for s in got]
    factors: AfterIdle | None = fitted((s.kind, s.place, ratio(s, clock), s.busy)
                                       for got, clock in passes for s in got)
    if factors is None:
        return []
    firsts = [0, *DECODE_BINS, REFERENCE_FROM]
    rows = []
    for busy, curve in ((False, factors), (True, factors.busy)):
        if curve is None:
            continue
        for j, place in enumerate(firsts):
            upto = firsts[j + 1] if j + 1 < len(firsts) else math.inf
            kind = "prefill" if place == 0 else "decode"
            seconds = [s.seconds for s in samples if s.kind == kind and s.busy == busy and place <= s.place < upto]
            if not seconds:  # the reference: pooled over both counts (after_idle.py ``fitted``)
                seconds = [s.seconds for s in samples if s.kind == kind and place <= s.place < upto]
            factor = curve.prefill if place == 0 else curve.decode_factor(place)
            rows.append({"impl": impl, "kind": "after_busy" if busy else "after_idle", "place": place,
                         "factor": factor, "seconds": statistics.median(seconds), "samples": len(seconds)})
    return rows
