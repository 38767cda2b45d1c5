"""The machine's pace: one fixed unit of the model's own work, timed in the serving thread while a validating job
measures its profile and while it serves its wall runs.

On the shared 2-core CPU machines the same code's steps run 0.8x to 1.9x their usual time for seconds to tens of
seconds at a stretch, with no load, no steal and no other process in the guest (docs/figures.md "Why the runs
move"): the host's. A wall run of 10-30 s caught in such a spell is slower than the profile priced it, whatever the
price. A probe on the other core does not see it (two probes' 1-second windows, one per core, correlated at
0.15-0.32); the thread that serves does.

The unit is the model's dense work at one fixed input: ``ROWS`` token rows through every layer's MLP (its norm
first) and the logits, on the model's own weights and kernels, with no cache and no attention. It knows nothing of
the shapes, the cache or the schedule a simulation prices, only how fast this thread runs the model's kind of work
now. A validating job times it after each grid point of its profile (the profile's pace) and, at most every
``PERIOD_S``, after a step of each wall run once the engine has run ``SETTLED`` steps since it last slept (the run's
pace); a run's pace is the median over its units of each one over the profile's unit after a step of the same batch
(harness/scenarios/profile.py prices the run's simulation at it).

Why by batch: the unit reads the state the step before it left. Measured on the Intel 2-core (paged_torch, tiny-llama,
one thread), units right after a decode step of 13-16 sequences took 1.84 ms where units after one sequence's step
took 1.16 ms, in the wall runs and after the profile's grid points alike (1.75 ms after its batch-16 points, 1.15 ms
after its batch-1 ones; a second unit straight after the first still 1.44-1.52 against 1.10-1.17): runs of large
batches read against the profile's unit over all its points read 12-29% slower than their steps ran against their
prices (the validation's paged_torch runs at 20 and 30 req/s, two runs). The profile
prices each step by its own shape, that state included; the pace compares each unit with the profile's after the
same batch.

Measured on the AMD EPYC 2-core over the runs docs/figures.md "The machine's pace" lists: the runs' pace and their
steps' own wall time over their prices correlated at 0.51-0.89 by run, and the simulations priced at the pace came
nearer the wall in most runs, by half or more in those a spell caught, further in some quiet ones. A fixed loop of
small torch ops (harness/measure/steadiness.py's), timed so, swung about twice as far as the model's steps in a
spell: it can flag one but not price it.

A tick adds one unit between two steps of a run (about 1.4 ms for tiny-llama: 0.6% of a run at a tick a quarter
second); ticks come at most every ``PERIOD_S`` and never more often than keeps them under ``MAX_SHARE`` of the run,
whatever the model's size. The wall figures include them; the simulated ones do not.
"""

from __future__ import annotations

import bisect
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

PERIOD_S = 0.25  # at most one unit a quarter second of a wall run
MAX_SHARE = 0.01  # and the units at most this share of it: a larger model's unit comes less often
SETTLED = 8  # steps since the engine last slept before a wall run's tick (after_idle.py: by then at about 1x)
ROWS = 4  # token rows of the unit: a small decode batch's
WARM_UNITS = 5  # untimed units first: the weights in cache, the dispatcher's paths warm


class Unit(NamedTuple):
    """One timed unit: its seconds, and the decode batch of the step (or profile point) it followed (0: a prefill,
    or nothing known)."""

    seconds: float
    batch: int = 0


def model_unit(model, rows: int = ROWS, seed: int = 0) -> Callable[[], float]:
    """The unit: ``rows`` fixed tokens' hidden rows through every layer's MLP (after its post-attention norm) and the
    logits, on ``model``'s weights and kernels; a callable that runs it once and returns its seconds. Every family
    here has these parts (harness/model: each decoder layer's ``mlp`` and ``post_attention_layernorm``, the model's
    ``embed_tokens`` and ``logits``); a mixture of experts routes the fixed rows to the same experts every time."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.cfg.vocab_size, (rows,), generator=gen).to(model.device)

    def run() -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            h = model.embed_tokens(ids)
            for layer in model.layers:
                h = h + layer.mlp(layer.post_attention_layernorm(h))
            model.logits(h)
        return time.perf_counter() - start

    return run


@dataclass
class PaceMeter:
    """The units timed in this process, in order (``ticks``): ``tick`` times one; ``observe`` is a step observer
    (the engine's ``observer``) that ticks at most every ``PERIOD_S`` (and ``MAX_SHARE``); ``mark`` and ``since``
    cut out a span of them."""

    unit: Callable[[], float]
    # the shortest gap between two steps that is a sleep (harness/serving/after_idle.py MIN_IDLE_S: the serving
    # room's, passed down to this one)
    min_idle_s: float
    ticks: list[Unit] = field(default_factory=list)
    # each tick's step: how many steps ``observe`` had seen before the one the unit followed (None: a tick of the
    # profile's, between its points), so that a run's steps table can tell the unit's time from a sleep
    after: list[int | None] = field(default_factory=list)
    steps_seen: int = 0
    _run_first: int = 0  # the steps seen before the last run's first step
    _next: float = float("-inf")  # perf_counter before which ``observe`` does not tick
    _end: float | None = None  # the last observed step's end on its run's clock
    _place: int = 0  # its place since the engine last slept (0: the first step after a sleep)
    _ticked: float = 0.0  # the unit timed after it, if any: time between two steps that is no sleep

    @classmethod
    def of_model(cls, model, min_idle_s: float) -> PaceMeter:
        meter = cls(model_unit(model), min_idle_s)
        for _ in range(WARM_UNITS):
            meter.unit()
        return meter

    def tick(self, after: int | None = None, batch: int = 0) -> float:
        """One unit, timed after a step (``after``: its index among the steps observed) or a profile point of decode
        ``batch`` sequences (0: a prefill); its seconds."""
        took = self.unit()
        self.ticks.append(Unit(took, batch))
        self.after.append(after)
        self._next = time.perf_counter() + max(PERIOD_S, took / MAX_SHARE)
        return took

    def observe(self, rec=None, *_step) -> None:
        """After a step (its record; the plan and the finished sequences unused): one unit, if its time has come and
        the engine has run ``SETTLED`` steps since it last slept. A unit right after a sleep and the step that ends
        it runs cold, as those steps do (harness/serving/after_idle.py): at 2 req/s, where most steps follow a sleep,
        units timed so read 1.35-1.47x in three runs of five where the steps ran at 1.08-1.18x their prices."""
        self.steps_seen += 1
        start, duration = getattr(rec, "start_s", None), getattr(rec, "duration_s", None)
        if start is not None and duration is not None:
            # a new run's clock starts again from 0; a tick's own time between two steps is no sleep
            if self._end is None or start < self._end:  # a new run (a repeat's, or the next rate's)
                self._run_first = self.steps_seen - 1
            slept = self._end is None or start < self._end or start - self._end - self._ticked >= self.min_idle_s
            self._place = 0 if slept else self._place + 1
            self._end, self._ticked = start + duration, 0.0
            if self._place < SETTLED:
                return
        if time.perf_counter() >= self._next:
            batch = int(getattr(rec, "batch", 0) or 0) if getattr(rec, "kind", None) in ("decode", "mixed") else 0
            self._ticked = self.tick(self.steps_seen - 1, batch)

    def mark(self) -> tuple[int, int]:
        """Where a span starts: (ticks, steps seen) so far."""
        return len(self.ticks), self.steps_seen

    def since(self, mark: tuple[int, int]) -> list[Unit]:
        """The units timed since ``mark``."""
        return self.ticks[mark[0]:]

    def after_steps(self, mark: tuple[int, int]) -> dict[int, float]:
        """The units timed since ``mark`` after the steps of the last run observed, by the step's place in that
        run (its row in the run's steps table: a scenario=decode row's is its last repeat's)."""
        first = max(mark[1], self._run_first)
        return {k - first: t.seconds for t, k in zip(self.ticks[mark[0]:], self.after[mark[0]:])
                if k is not None and k >= first}


def reference(profile: list[Unit]) -> Callable[[int], float]:
    """The profile's unit after a step of a batch: its median unit after each batch it profiled, linear between the
    two around a batch (the nearest at either end); after a prefill (0), its median after its prefill points (all
    its units' where it has none)."""
    by: dict[int, list[float]] = {}
    for u in profile:
        by.setdefault(u.batch, []).append(u.seconds)
    median = {b: statistics.median(v) for b, v in by.items()}
    overall = statistics.median(u.seconds for u in profile)
    decode = sorted(b for b in median if b > 0)

    def at(batch: int) -> float:
        if batch <= 0 or not decode:
            return median.get(0, overall)
        if batch <= decode[0] or batch >= decode[-1]:
            return median[decode[0] if batch <= decode[0] else decode[-1]]
        i = bisect.bisect_left(decode, batch)
        lo, hi = decode[i - 1], decode[i]
        w = (batch - lo) / (hi - lo)
        return (1 - w) * median[lo] + w * median[hi]

    return at


def pace(run: list[Unit], profile: list[Unit]) -> float | None:
    """The machine's pace in a run against its profile's: the median over the run's units of each one over the
    profile's unit after the same batch (``reference``): 1.2, the run's thread took 1.2x as long for the same work in
    the same state; None without a unit on either side."""
    if not run or not profile:
        return None
    ref = reference(profile)
    return statistics.median(u.seconds / ref(u.batch) for u in run)
