"""harness/serving/after_idle.py: the price factors of the steps after the engine slept, by their place, and
how they are found from probed steps."""

from __future__ import annotations

import random

import pytest

from kvbench.harness.serving.after_idle import (DECODE_BINS, MIN_IDLE_S, REFERENCE_FROM, AfterIdle, fitted, places,
                                              step_factors)

CURVE = AfterIdle(1.3, ((1, 1.5), (2, 1.2), (4, 1.0), (32, 0.9)))


def test_each_place_takes_its_bins_factor_and_a_late_prefill_is_priced_as_measured():
    assert [CURVE.decode_factor(k) for k in (0, 1, 2, 3, 4, 31, 32, 10**9)] == [1.5, 1.5, 1.2, 1.2, 1.0, 1.0, 0.9, 0.9]
    assert CURVE.step_factor("prefill", 0) == 1.3 and CURVE.step_factor("prefill", 5) == 1.0
    assert CURVE.step_factor("decode", 2) == CURVE.step_factor("mixed", 2) == 1.2


@pytest.mark.parametrize("seed", range(20))
def test_segments_cover_a_jumps_places_in_order_each_with_its_places_factor(seed):
    rng = random.Random(seed)
    k0, steps = rng.choice([0, 1, 3, 30, 10**9]), rng.randint(1, 80)
    runs = CURVE.segments(k0, steps)
    assert sum(n for n, _ in runs) == steps and all(n > 0 for n, _ in runs)
    flat = [f for n, f in runs for _ in range(n)]
    assert flat == [CURVE.decode_factor(k0 + j) for j in range(steps)]
    assert all(a != b for (_, a), (_, b) in zip(runs, runs[1:]))  # one run per factor: the fewest prices


def test_places_count_steps_since_the_last_sleep():
    # steps of 1 ms back to back, then a 10 ms sleep, then a 1 ms wait (not a sleep), then more
    starts = [0.0, 0.001, 0.002, 0.013, 0.014, 0.016, 0.017]
    assert places(starts, [0.001] * 7) == [0, 1, 2, 0, 1, 2, 3]
    assert MIN_IDLE_S > 0.001  # the 1 ms wait above is below a sleep


def test_factors_are_each_bins_median_ratio_over_the_probes_own_later_steps():
    """The probe's engine is not the wall run's: its steps' level is not theirs (here 0.8 of the grid's price),
    but how much slower its first steps are than its later ones is the sleep's."""
    samples = [("prefill", 0, r) for r in (0.96, 1.12, 1.04)] + [("prefill", 3, 9.0)]  # a late prefill: not place 0
    samples += [("decode", k, 0.8) for k in range(REFERENCE_FROM, 32)] + [("decode", 40, 5.0)]
    for b, r in zip(DECODE_BINS, (1.2, 1.0, 0.88)):
        samples += [("decode", b, r), ("decode", b, r), ("decode", b, 4.0)]
    got = fitted(samples)
    assert got.prefill == pytest.approx(1.3)
    assert [k for k, _ in got.decode] == [1, 2, 3, REFERENCE_FROM]
    assert [f for _, f in got.decode] == pytest.approx([1.5, 1.25, 1.1, 1.0])
    assert got.decode_factor(10**6) == 1.0  # deeper in a stretch: the grid's price


def test_a_bin_without_samples_or_a_factor_no_cache_explains_gives_no_factors():
    full = [("prefill", 0, 1.2), ("decode", REFERENCE_FROM, 1.0)] + [("decode", b, 1.0) for b in DECODE_BINS]
    assert fitted(full) is not None
    assert fitted([s for s in full if s[1] != DECODE_BINS[-1]]) is None  # the probe never reached a bin
    assert fitted([s for s in full if s[1] != REFERENCE_FROM]) is None  # nor its reference
    assert fitted([s for s in full if s[0] != "prefill"]) is None
    assert fitted(full[:2] + [("decode", b, 40.0) for b in DECODE_BINS]) is None  # a stall of seconds


@pytest.mark.parametrize("decode, said", [(((2, 1.0),), "start at step 1"), (((1, 1.0), (1, 1.1)), "ascend"),
                                          (((1, 9.0),), "outside")])
def test_a_malformed_curve_is_refused(decode, said):
    with pytest.raises(ValueError, match=said):
        AfterIdle(1.0, decode)


def test_from_places_reads_a_tables_place_to_factor_map():
    assert AfterIdle.from_places({3: 1.1, 0: 1.3, 1: 1.5, 2: 1.2, 4: 1.0}) == AfterIdle(
        1.3, ((1, 1.5), (2, 1.2), (3, 1.1), (4, 1.0)))
    with pytest.raises(ValueError, match="need place 0"):
        AfterIdle.from_places({1: 1.0})


BUSY = AfterIdle(1.3, ((1, 1.5), (2, 1.2), (4, 1.0)), AfterIdle(1.2, ((1, 1.1), (3, 1.0))))


def test_a_busy_prefill_takes_its_own_factor_and_the_steps_after_it_count_from_it():
    """A whole prompt's prefill past place 0 is a busy one (run between decode steps, no sleep before it); a chunk
    there is priced as measured; without a busy curve the old rule holds (1, and the count goes on)."""
    assert BUSY.step_factor("prefill", 0) == 1.3 and BUSY.step_factor("prefill", 7) == 1.2
    assert BUSY.step_factor("prefill", 0, busy=True) == 1.2  # a busy prefill is its own curve's place 0
    assert BUSY.step_factor("chunk", 0) == 1.3 and BUSY.step_factor("chunk", 7) == 1.0
    assert [BUSY.decode_factor(k, busy=True) for k in (1, 2, 3, 9)] == [1.1, 1.1, 1.0, 1.0]
    assert BUSY.next_place("prefill", 7, False) == (1, True) and BUSY.next_place("prefill", 0, False) == (1, False)
    assert BUSY.next_place("decode", 2, True) == (3, True) and BUSY.next_place("chunk", 5, False) == (6, False)
    assert CURVE.next_place("prefill", 7, False) == (8, False)  # no busy curve: one place further on
    assert BUSY.segments(1, 4, busy=True) == [(2, 1.1), (2, 1.0)]
    with pytest.raises(ValueError, match="no curve of its own"):
        AfterIdle(1.0, ((1, 1.0),), BUSY)


def test_step_factors_follow_a_runs_steps_as_the_simulator_prices_them():
    # a prefill after a sleep, two decodes, a busy prefill, two decodes, a 10 ms sleep, a prefill, a decode
    kinds = ["prefill", "decode", "decode", "prefill", "decode", "decode", "prefill", "decode"]
    starts = [0.0, 0.001, 0.002, 0.003, 0.004, 0.005, 0.016, 0.017]
    got = step_factors(BUSY, kinds, starts, [0.001] * 8)
    assert got == [(0, False, 1.3), (1, False, 1.5), (2, False, 1.2), (0, True, 1.2), (1, True, 1.1),
                   (2, True, 1.1), (0, False, 1.3), (1, False, 1.5)]
    assert [p for p, _, _ in step_factors(CURVE, kinds, starts, [0.001] * 8)] == [0, 1, 2, 3, 4, 5, 0, 1]


def test_the_busy_curve_is_fitted_over_the_same_reference_and_is_left_out_where_a_bin_is_missing():
    sleep = [("prefill", 0, 1.3, False)] + [("decode", b, 1.0, False) for b in DECODE_BINS]
    ref = [("decode", k, 0.8, busy) for k in range(REFERENCE_FROM, 12) for busy in (False, True)]
    busy = [("prefill", 0, 0.96, True)] + [("decode", b, r, True) for b, r in zip(DECODE_BINS, (0.88, 0.84, 0.8))]
    got = fitted(sleep + ref + busy)
    assert got.busy.prefill == pytest.approx(1.2)
    assert [f for _, f in got.busy.decode] == pytest.approx([1.1, 1.05, 1.0, 1.0])
    assert fitted(sleep + ref + busy[:-1]).busy is None  # the busy curve's last bin never reached: the sleep's alone
    assert fitted(sleep + ref).busy is None and fitted(sleep + ref).prefill == pytest.approx(1.3 / 0.8)
    assert AfterIdle.from_places({0: 1.3, 1: 1.5}, {0: 1.2, 1: 1.1, 3: 1.0}) == AfterIdle(
        1.3, ((1, 1.5),), AfterIdle(1.2, ((1, 1.1), (3, 1.0))))
