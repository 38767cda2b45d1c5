"""A simulated clock that prices each step from a measured profile of the real model's steps.

The roofline (harness/serving/cost_model.py) assumes constants; a profile measures them. A
profile (``scenario=profile``, harness/scenarios/profile.py) holds, for one impl on one device:

- decode points: ``(batch, context, seconds)``: one decode step of ``batch`` sequences whose
  mean context (KV tokens the step's attention reads, over ``batch``) is ``context``;
- prefill points: ``(tokens, seconds)``: one prefill forward computing ``tokens`` prompt tokens.

Prices are interpolated, piecewise-linearly, never fitted:

    prefill_s(T)      = f(T), f linear between the profiled token counts; below the smallest, its
                        time (a prefill is never cheaper than the smallest measured); above the
                        largest, the last segment's line extended.
    decode_s(B, R)    = g_B(R / B), where g_b(c) is linear in the context c between profiled
                        contexts (extended by its end segments outside them), and g_B lies
                        linearly between the two profiled batches around B (the nearest two at
                        either end, a batch below the smallest priced as the smallest).
    decode_s(B, R, k) = sum over j < k of decode_s(B, R + j*B): the context grows by one token
                        per step, so the sum is a sum of arithmetic series, one per segment.

    mixed_s(T, B, R)  = decode_s(B, R) + f'(T + B) - f'(B) + a0, where f' is f extended below its
                        smallest point by its first segment, and a0 the attention time of that smallest
                        prefill point: chunked prefill's step of T prompt-chunk tokens and B decodes is
                        the decode step as measured, plus what T more rows add to a forward along the
                        prefill line (its fixed cost is paid once, in the decode), plus the prefill
                        attention path the chunk's rows take beside the decode one (each layer calls
                        both: harness/serving/engine.py), whose fixed cost the difference of f cancels.
                        B = 0 is prefill_s(T). A composition of the two measured kinds, checked by
                        the clock's validation against wall-clock runs with chunked prefill: without
                        a0 its mixed steps ran at a median 1.04-1.16x their price on the Intel 2-core,
                        with it 1.02-1.05x (a0 0.5-0.8 ms of a 3.5-4.3 ms smallest prefill, tiny-llama).

A profile that measured them also holds ``after_idle`` factors: what a step costs against these prices by its
place since the engine last slept (harness/serving/after_idle.py); the simulator applies them, not this clock.

Every price is at least 0. A step whose batch or context lies outside the profile is counted
in ``outside``, so a row can say how much of its run the profile did not cover, and priced by
``fallback`` (the roofline of ``gpu=NAME``, when the run names one) or else by the extension.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence as Seq

from kvbench.harness.serving.after_idle import AfterIdle
from kvbench.harness.serving.layer_terms import Spans


@dataclass(frozen=True)
class Line:
    """A piecewise-linear function through ``(xs[i], ys[i])``, extended by its end segments."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.xs) != len(self.ys) or not self.xs:
            raise ValueError("a line needs as many ys as xs, and at least one point")
        if any(b <= a for a, b in zip(self.xs, self.xs[1:])):
            raise ValueError(f"a line's xs must increase: {self.xs}")

    def _segment(self, i: int) -> tuple[float, float]:
        """(intercept, slope) of segment i (between points i and i+1); one point: a constant."""
        if len(self.xs) == 1:
            return self.ys[0], 0.0
        i = min(max(i, 0), len(self.xs) - 2)
        x0, x1, y0, y1 = self.xs[i], self.xs[i + 1], self.ys[i], self.ys[i + 1]
        slope = (y1 - y0) / (x1 - x0)
        return y0 - slope * x0, slope

    def __call__(self, x: float) -> float:
        a, s = self._segment(bisect.bisect_right(self.xs, x) - 1)
        return a + s * x

    def sum_steps(self, x0: float, k: int) -> float:
        """sum over j = 0..k-1 of self(x0 + j), by segment: each is an arithmetic series."""
        total, j = 0.0, 0
        while j < k:
            x = x0 + j
            i = bisect.bisect_right(self.xs, x) - 1
            a, s = self._segment(i)
            # the last j that stays on this segment (the end segments run on forever)
            if 0 <= i < len(self.xs) - 2 or (i < 0 and len(self.xs) > 1):
                upper = self.xs[max(i, 0) + 1]
                end = min(k, j + max(1, math.ceil(upper - x)))
            else:
                end = k
            n = end - j
            total += n * a + s * (n * x0 + (j + end - 1) * n / 2)
            j = end
        return total


@dataclass(frozen=True)
class ProfilePoints:
    """A profile's measured points (what its table holds), for one impl on one device."""

    decode: tuple[tuple[int, float, float], ...]  # (batch, mean context, seconds)
    prefill: tuple[tuple[int, float], ...]  # (tokens, seconds)
    # The attention seconds of the smallest prefill point: the prefill path a mixed step runs beside the decode
    # one (``mixed_s``); 0 where the table times no attention (made before it did)
    prefill_path_s: float = 0.0
    # What the steps after the engine slept cost against these prices (harness/serving/after_idle.py); None where
    # the table holds no after-idle rows (made before the probe): the simulator then prices every step as here
    after_idle: AfterIdle | None = None

    def at_pace(self, pace: float) -> ProfilePoints:
        """These points with every time ``pace`` times as long: the prices of a machine running the same work at
        that pace against the profile's (harness/measure/pace_meter.py); the after-idle factors, ratios, stay."""
        return ProfilePoints(tuple((b, c, s * pace) for b, c, s in self.decode),
                             tuple((t, s * pace) for t, s in self.prefill), self.prefill_path_s * pace, self.after_idle)


def prefill_path_s(points: Iterable[tuple[float, float | None]]) -> float:
    """``ProfilePoints.prefill_path_s`` from the prefill points' (tokens, attention seconds): the smallest
    point's, or 0 where it has none."""
    ordered = sorted(points, key=lambda p: p[0])
    if not ordered:
        return 0.0
    a = ordered[0][1]
    return float(a) if a is not None and math.isfinite(float(a)) and float(a) > 0 else 0.0


def profile_id(points: ProfilePoints) -> str:
    """A short digest of the points: what a row names as its clock (the same points, the same id). A table made
    before the prefill path was priced keeps its id."""
    text = repr((sorted(points.decode), sorted(points.prefill)))
    if points.prefill_path_s:
        text += repr(points.prefill_path_s)
    if points.after_idle is not None:
        text += repr(points.after_idle)
    return "profile-" + hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass
class ProfiledClock:
    """Prices steps by interpolating a profile (the simulator's ``StepClock``)."""

    points: ProfilePoints
    outside: int = 0  # steps priced outside the profiled batches or contexts
    fallback: object | None = None  # a StepClock for the shapes outside the profile (else: the extension)
    notes: tuple[str, ...] = ()  # what the row says of the profile (harness/serving/clocks.py provenance_notes)
    _batches: tuple[int, ...] = field(init=False, repr=False)
    _by_batch: dict[int, Line] = field(init=False, repr=False)
    _prefill: Line = field(init=False, repr=False)
    _contexts: dict[int, tuple[float, float]] = field(init=False, repr=False)  # each batch's line's range
    _tokens: tuple[int, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.points.decode or not self.points.prefill:
            raise ValueError("a profile needs decode points and prefill points")
        by: dict[int, dict[float, float]] = {}
        for batch, context, seconds in self.points.decode:
            by.setdefault(int(batch), {})[float(context)] = float(seconds)
        self._batches = tuple(sorted(by))
        self._by_batch = {b: Line(tuple(sorted(by[b])), tuple(by[b][c] for c in sorted(by[b]))) for b in by}
        self._contexts = {b: (min(by[b]), max(by[b])) for b in by}
        prefill = dict((int(t), float(s)) for t, s in self.points.prefill)
        tokens = sorted(prefill)
        self._prefill = Line(tuple(map(float, tokens)), tuple(prefill[t] for t in tokens))
        self._tokens = (tokens[0], tokens[-1])

    @property
    def id(self) -> str:
        return profile_id(self.points)

    @property
    def after_idle(self) -> AfterIdle | None:
        """The factors the simulator multiplies a step's price by, by its place after a sleep (sim_clock.py)."""
        return self.points.after_idle

    def prefill_s(self, tokens: int, prompts: int = 1, spans: Spans = ()) -> float:
        """The profile's prefill of ``tokens`` (``spans`` serve only the roofline it falls back to). Its measured
        steps hold the attention of a fresh prompt of ``tokens``: a later chunk, or a prompt after prefix-cache hits,
        attends to more keys than that, which the profile does not price (a few percent of a step on the tiny
        models it profiles; 7% of a second 2,048-token chunk of Llama-3.1-8B on an H100 by the roofline)."""
        lo, hi = self._tokens
        if tokens > hi:
            self.outside += 1
            if self.fallback is not None:
                return self.fallback.prefill_s(tokens, prompts, spans)
        return max(0.0, self._prefill(max(tokens, lo)))

    def mixed_s(self, tokens: int, batch: int, kv_tokens_read: int, spans: Spans = ()) -> float:
        if not batch:
            return self.prefill_s(tokens, spans=spans) if tokens else 0.0
        if not tokens:
            return self.decode_s(batch, kv_tokens_read)
        beyond = tokens + batch > self._tokens[1]
        if beyond and self.fallback is not None:  # one step, counted once whichever part lies outside
            self.outside += 1
            return self.fallback.mixed_s(tokens, batch, kv_tokens_read, spans)
        outside = self._outside_decode(batch, kv_tokens_read, 1)
        if beyond or outside:
            self.outside += 1
        decode = self._decode_price(batch, kv_tokens_read, 1, outside)
        return decode + max(0.0, self._prefill(tokens + batch) - self._prefill(batch)) + self.points.prefill_path_s

    def host_copy_s(self, stores: int, loads: int, block_tokens: int) -> float:
        """A profile times no host copies: the roofline's host link prices them (gpu=NAME)."""
        if not stores + loads:
            return 0.0
        if self.fallback is None:
            raise ValueError("a host tier or swap on a profiled clock needs gpu=NAME for its host link")
        return self.fallback.host_copy_s(stores, loads, block_tokens)

    def _around(self, batch: int) -> tuple[int, int, float]:
        """The profiled batches whose lines price ``batch``, and the weight of the second."""
        bs = self._batches
        if len(bs) == 1 or batch <= bs[0]:
            return bs[0], bs[0], 0.0
        i = min(bisect.bisect_left(bs, batch), len(bs) - 1)
        b0, b1 = bs[i - 1], bs[i]
        return b0, b1, (batch - b0) / (b1 - b0)

    def _outside_decode(self, batch: int, kv_tokens_read: int, steps: int) -> bool:
        """Past the largest batch, or past the contexts of either batch line that prices it (a profile of a small
        KV budget measures a large batch at the short contexts its budget holds only: scenario=profile's reach)."""
        if batch > self._batches[-1]:
            return True
        b0, b1, _ = self._around(batch)
        lo = max(self._contexts[b0][0], self._contexts[b1][0])
        hi = min(self._contexts[b0][1], self._contexts[b1][1])
        context = kv_tokens_read / batch
        return context < lo or context + steps - 1 > hi

    def decode_s(self, batch: int, kv_tokens_read: int, steps: int = 1) -> float:
        """The price of a record's ``steps`` decode steps; those outside the profile are counted."""
        if steps < 1:
            raise ValueError(f"steps={steps} must be >= 1")
        outside = batch >= 1 and self._outside_decode(batch, kv_tokens_read, steps)
        if outside:
            self.outside += steps
        return self._decode_price(batch, kv_tokens_read, steps, outside)

    def decode_price_s(self, batch: int, kv_tokens_read: int, steps: int = 1) -> float:
        """``decode_s`` without counting: the simulator asks this while it searches where a jump ends,
        and ``outside`` counts each step priced once, in its record."""
        if steps < 1:
            raise ValueError(f"steps={steps} must be >= 1")
        outside = batch >= 1 and self.fallback is not None and self._outside_decode(batch, kv_tokens_read, steps)
        return self._decode_price(batch, kv_tokens_read, steps, outside)

    def _decode_price(self, batch: int, kv_tokens_read: int, steps: int, outside: bool) -> float:
        """The price of ``steps`` decode steps, ``outside`` (already known: ``_outside_decode``) sending them to
        the fallback where there is one."""
        if batch < 1:
            return 0.0
        if outside and self.fallback is not None:
            return self.fallback.decode_s(batch, kv_tokens_read, steps)
        context = kv_tokens_read / batch
        b0, b1, w = self._around(batch)
        first = self._by_batch[b0].sum_steps(context, steps)
        if w == 0.0:
            return max(0.0, first)
        return max(0.0, (1 - w) * first + w * self._by_batch[b1].sum_steps(context, steps))

    def decode_steps_s(self, batch: int, kv_tokens_read: int, steps: int) -> list[float]:
        """Each of ``steps`` decode steps' own price (uncounted: the record's ``decode_s`` counted them)."""
        price = self.decode_price_s
        return [price(batch, kv_tokens_read + j * batch) for j in range(steps)]

def clock_from_rows(decode: Seq[tuple[int, float, float]], prefill: Seq[tuple[int, float]]) -> ProfiledClock:
    return ProfiledClock(ProfilePoints(tuple(decode), tuple(prefill)))
