"""Steps after the engine idled: what they cost against the profile's price, by how many steps ago it slept.

A serving engine with nothing to run sleeps until the next request arrives. Measured on the 2-core CPU
machines (the steps tables of the clock validation's wall runs, every impl, both machines), the steps after
such a sleep are not the steps a profile prices: the prefill that ends the sleep ran at 1.17-1.59x its price
(busy prefills: 0.96-1.09x); the decode steps after it at 1.19x (AMD) and 1.66x (Intel) for the first, 1.08x
and 1.33x for the second, about 1.0x by the fourth. The sleep empties the caches the steps ran warm in; the
first steps after it refill them. At 5-10 req/s most prefills end a sleep, and every request's TTFT is one.

The profile measures the curve itself (``scenario=profile``'s after-idle probe,
harness/scenarios/after_idle_probe.py): one sequence served after a sleep, each step's time over the price the
grid gives its shape, divided by the same ratio of the probe's own later steps (its ``REFERENCE_FROM``-th on):
the probe's engine is not the wall run's (its pool holds one sequence), so its steps' level is not theirs, but
how much slower its first steps are than its later ones is the sleep's. Deeper into a busy stretch the wall
steps ran at 0.85-0.91x their price, a level the probe cannot reproduce (its own late steps ran at 0.69-1.05x
the grid's across runs): places from the reference on are priced as the grid measured them. ``AfterIdle`` holds
the factors; the simulator counts the steps since it last idled and multiplies each step's price by the factor
of its place (harness/serving/sim_clock.py). A profile made before the probe has none: every factor is 1.

A prefill needs no sleep to disturb the caches. In one validation run on the Intel 2-core (tiny-llama, before this
curve), a whole-prompt prefill run between decode steps (a *busy* prefill) ran at 1.16-1.26x its price (contiguous,
paged_cuda; paged_torch 1.15x against its decode steps' level), and the decode steps right after it at 1.07-1.16x,
1.04-1.09x, 1.01-1.06x the stretch's: the grid times each prefill point right after another prefill, warm for it.
``busy`` holds that curve (the same shape: the prefill's factor, then the decode places after it), probed the same
way: a second prompt arrives while the probe's first sequence decodes (nine profiles: the busy prefill at
0.99-1.17x, the first decode step after it at 0.99-1.16x). The places after a busy prefill count from it; a chunk of
a chunked prefill is no busy prefill (its mixed steps are the composition profiled_clock.py ``mixed_s`` prices).
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass, field
from typing import Iterable, Sequence

# An idle spell shorter than this is not a sleep: the engine's own pause between steps is tens of microseconds,
# and the wall runs' prefills after a 2-10 ms wait already ran at 1.05-1.13x their price.
MIN_IDLE_S = 0.002
# The decode places (since the sleep) with a factor of their own: the steep part of the curve.
DECODE_BINS = (1, 2, 3)
# From this place on a step costs the grid's price (factor 1): the probe's steps from here are its reference.
REFERENCE_FROM = 4
# A factor outside this range is not a cache refilling: a unit slip or a broken table.
MIN_FACTOR, MAX_FACTOR = 0.2, 5.0
STEADY = 1 << 40  # steps since the sleep before any sleep was seen: the last bin's


@dataclass(frozen=True)
class AfterIdle:
    """Price factors of the steps after a sleep: ``prefill`` for the prefill that ends it (step 0), ``decode``
    as (first step index, factor) ascending from 1, each holding up to the next."""

    prefill: float
    decode: tuple[tuple[int, float], ...]
    # the curve after a busy prefill (its ``prefill``: that prefill's factor; its ``decode``: the places after it);
    # None where the profile did not probe it (made before): such a prefill is priced as measured, and the steps
    # after it go on by their place since the sleep
    busy: AfterIdle | None = None
    # each decode bin's first place, derived once: the simulator asks a factor at every step it prices
    _firsts: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        firsts = tuple(k for k, _ in self.decode)
        object.__setattr__(self, "_firsts", firsts)
        if not firsts or firsts[0] != 1 or any(b <= a for a, b in zip(firsts, firsts[1:])):
            raise ValueError(f"after-idle decode factors must start at step 1 and ascend: {firsts}")
        for f in (self.prefill, *(f for _, f in self.decode)):
            if not MIN_FACTOR <= f <= MAX_FACTOR:
                raise ValueError(f"after-idle factor {f:g} is outside [{MIN_FACTOR:g}, {MAX_FACTOR:g}]")
        if self.busy is not None and self.busy.busy is not None:
            raise ValueError("a busy prefill's curve has no curve of its own")

    @classmethod
    def from_places(cls, factors: dict[int, float], busy: dict[int, float] | None = None) -> AfterIdle:
        """From {place: factor}, as a profile table's rows hold them: place 0 the prefill's, the rest the decode
        places' (ValueError where place 0 is missing or the decode places do not start at 1); ``busy`` the same
        after a busy prefill."""
        rest = dict(factors)
        if 0 not in rest:
            raise ValueError(f"after-idle factors need place 0 (the prefill); places: {sorted(rest)}")
        return cls(rest.pop(0), tuple(sorted(rest.items())), cls.from_places(busy) if busy else None)

    def _curve(self, busy: bool) -> AfterIdle:
        return self.busy if busy and self.busy is not None else self

    def decode_factor(self, k: int, busy: bool = False) -> float:
        """The factor of a decode step ``k`` steps after the sleep (``busy``: after the busy prefill; a decode with
        no prefill before it, k = 0, takes the first step's)."""
        c = self._curve(busy)
        return c.decode[bisect.bisect_right(c._firsts, max(k, 1)) - 1][1]

    def step_factor(self, kind: str, k: int, busy: bool = False) -> float:
        """A step's factor by its kind and place (``busy``: counted from a busy prefill): the prefill (or a
        ``chunk``, a chunked step computing only prompt chunks) that ends a sleep takes ``prefill``; a later
        whole-prompt prefill is a busy one (``busy.prefill``; 1 without that curve), a later chunk priced as
        measured (1); decode and mixed steps their place's decode factor."""
        if kind in ("prefill", "chunk"):
            if k == 0:  # place 0: the sleep's prefill, or (``busy``) the busy one's own place
                return self._curve(busy).prefill
            return self.busy.prefill if kind == "prefill" and self.busy is not None else 1.0
        return self.decode_factor(k, busy)

    def next_place(self, kind: str, k: int, busy: bool) -> tuple[int, bool]:
        """The place (and whether it counts from a busy prefill) of the step after a ``kind`` step at place ``k``:
        a busy prefill starts its own count, where the curve has one; any other step is one place further on."""
        if kind == "prefill" and k > 0 and self.busy is not None:
            return 1, True
        return k + 1, busy

    def segments(self, k0: int, steps: int, busy: bool = False) -> list[tuple[int, float]]:
        """Decode steps ``k0 .. k0 + steps - 1`` (their places since the sleep, or since the busy prefill) as
        (count, factor) runs, in order: a jump's closed-form price is one per run."""
        c = self._curve(busy)
        out: list[tuple[int, float]] = []
        firsts = c._firsts
        k, end = k0, k0 + steps
        while k < end:
            i = bisect.bisect_right(firsts, max(k, 1)) - 1
            upto = end if i + 1 >= len(firsts) else min(end, firsts[i + 1])
            out.append((upto - k, c.decode[i][1]))
            k = upto
        return out


def places(starts: Sequence[float], durations: Sequence[float], min_idle_s: float = MIN_IDLE_S) -> list[int]:
    """Each step's place since the engine last slept (0: the first step after a sleep), from the steps' start
    times and durations in order; a step before any sleep (the first one) counts as just after one."""
    out: list[int] = []
    end = None
    for start, dur in zip(starts, durations):
        out.append(0 if end is None or start - end >= min_idle_s else out[-1] + 1)
        end = start + dur
    return out


def step_factors(after: AfterIdle, kinds: Sequence[str], starts: Sequence[float], durations: Sequence[float],
                 min_idle_s: float = MIN_IDLE_S) -> list[tuple[int, bool, float]]:
    """Each step's (place, whether it counts from a busy prefill, factor), as the simulator prices it
    (harness/serving/sim_clock.py), from a run's step kinds (``prefill`` a whole-prompt one, ``chunk`` a step of
    prompt chunks alone, ``decode``, ``mixed``), start times and durations in order."""
    out: list[tuple[int, bool, float]] = []
    k, busy = 0, False
    for kind, slept in zip(kinds, (p == 0 for p in places(starts, durations, min_idle_s))):
        if slept:
            k, busy = 0, False
        factor = after.step_factor(kind, k, busy)
        after_it = after.next_place(kind, k, busy)
        # a busy prefill is its own curve's place 0
        out.append((0, True, factor) if k > 0 and after_it == (1, True) and kind == "prefill" else (k, busy, factor))
        k, busy = after_it
    return out


def _fitted_curve(pre: list[float], by_bin: dict[int, list[float]], level: float) -> AfterIdle | None:
    """One curve's factors (each bin's median ratio over ``level``); None where a bin or the prefill has no sample,
    or a factor lies outside [MIN_FACTOR, MAX_FACTOR]."""
    if not pre or any(b not in by_bin for b in DECODE_BINS):
        return None
    factors = [statistics.median(pre) / level, *(statistics.median(by_bin[b]) / level for b in DECODE_BINS)]
    if not all(MIN_FACTOR <= f <= MAX_FACTOR for f in factors):
        return None  # not a cache refilling (a machine that stalled for seconds): measured, but not a price
    return AfterIdle(factors[0], (*zip(DECODE_BINS, factors[1:]), (REFERENCE_FROM, 1.0)))


def fitted(samples: Iterable[tuple]) -> AfterIdle | None:
    """The factors from (kind, place, step seconds / its price[, busy]) samples (``busy``: the place counts from a
    busy prefill, a prefill's own place 0): each bin's median ratio (the prefill's: place-0 prefills') over the
    median ratio of the decode steps from ``REFERENCE_FROM`` on (of either count), whose factor is 1. None where a
    bin, the prefill or the reference of the sleep's curve has no sample, or a factor lies outside
    [MIN_FACTOR, MAX_FACTOR]; the busy curve likewise, or absent (the sleep's alone)."""
    pre: dict[bool, list[float]] = {False: [], True: []}
    ref: list[float] = []
    by_bin: dict[bool, dict[int, list[float]]] = {False: {}, True: {}}
    for kind, k, ratio, *rest in samples:
        busy = bool(rest and rest[0])
        if kind == "prefill" and k == 0:
            pre[busy].append(ratio)
        elif kind == "decode" and k >= REFERENCE_FROM:
            ref.append(ratio)
        elif kind == "decode" and k >= 1:
            by_bin[busy].setdefault(DECODE_BINS[bisect.bisect_right(DECODE_BINS, k) - 1], []).append(ratio)
    if not ref:
        return None
    level = statistics.median(ref)
    sleep = _fitted_curve(pre[False], by_bin[False], level)
    if sleep is None:
        return None
    busy = _fitted_curve(pre[True], by_bin[True], level)
    return AfterIdle(sleep.prefill, sleep.decode, busy)
