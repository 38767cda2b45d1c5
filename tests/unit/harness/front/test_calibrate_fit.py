"""The calibration's search, on figures made by formulas of the engine profile's shape (no simulation): the box
solves are exact, the L1 fit shrugs off an outlier, and the search recovers known constants in few evaluations."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from kvbench.harness.front.calibrate_fit import bounds, box_least_squares, fit, mean_abs, solve_box_l1

RNG = np.random.default_rng(0)


def test_the_box_solve_is_the_best_point_of_a_fine_grid_when_the_bounds_bind():
    a, b = RNG.normal(size=(12, 3)), RNG.normal(size=12) * 3
    lo, hi = np.array([-0.2, 0.0, -1.0]), np.array([0.2, 0.1, 1.0])
    x = box_least_squares(a, b, lo, hi, ridge=0.0)
    assert ((x >= lo - 1e-12) & (x <= hi + 1e-12)).all()
    grid = [np.array(g) for g in itertools.product(*(np.linspace(l, h, 41) for l, h in zip(lo, hi)))]
    best = min(grid, key=lambda g: np.sum((a @ g - b) ** 2))
    assert np.sum((a @ x - b) ** 2) <= np.sum((a @ best - b) ** 2) + 1e-12
    free = np.linalg.lstsq(a, b, rcond=None)[0]
    assert not ((free >= lo) & (free <= hi)).all()  # the bounds did bind: the test checks the clipping


def test_the_l1_solve_ignores_one_wild_figure_where_least_squares_follows_it():
    a = np.column_stack([np.ones(9), np.arange(9.0)])
    b = a @ np.array([1.0, 0.5])
    b[4] += 30.0  # one figure far off (a mistyped file, a noisy run)
    lo, hi = np.full(2, -100.0), np.full(2, 100.0)
    assert solve_box_l1(a, b, lo, hi) == pytest.approx([1.0, 0.5], abs=1e-4)
    assert box_least_squares(a, b, lo, hi, 0.0) != pytest.approx([1.0, 0.5], abs=0.5)


# Figures of three runs (1, 8 and 32 sequences a step) as the engine profile builds them: TTFT carries fe and a
# prompt step's host cost; TPOT a decode step's host cost plus the GPU's; throughput is S over a step.
DEVICE_S = {1: 4e-3, 8: 4.6e-3, 32: 6e-3}
PROMPT_S = {1: 8e-3, 8: 30e-3, 32: 110e-3}


def figures(theta) -> np.ndarray:
    fe, o, c = theta
    out = []
    for s in (1, 8, 32):
        host = (o + c * s) * 1e-6
        step = host + DEVICE_S[s]
        out += [1e3 * (fe * 1e-3 + host + PROMPT_S[s]), 1e3 * step, s / step]  # ttft_ms, tpot_ms, output_tok_s
    return np.array(out)


class Counted:
    def __init__(self):
        self.calls = 0

    def __call__(self, thetas):
        self.calls += len(thetas)
        return np.array([figures(t) for t in thetas])


def test_the_search_recovers_known_constants_from_the_default_ones():
    truth = np.array([40.0, 2000.0, 25.0])
    evaluate = Counted()
    got = fit(evaluate, [19.0, 1000.0, 10.0], figures(truth))
    assert got.theta == pytest.approx(truth, rel=2e-3)
    assert got.before > 0.2 and got.after < 1e-3
    assert evaluate.calls <= 1 + 2 * 4 + 2  # two rounds of probes at most: the figures are nearly linear


def test_a_constant_no_figure_moves_stays_where_it_was():
    def no_seq(thetas):  # every run at one sequence a step, c's effect folded into o: c cannot be told apart
        return np.array([figures([t[0], t[1] + t[2], 0.0])[:3] for t in thetas])

    got = fit(no_seq, [19.0, 1000.0, 10.0], figures([40.0, 2000.0, 0.0])[:3])
    assert got.theta[0] == pytest.approx(40.0, abs=0.01)
    assert got.theta[1] + got.theta[2] == pytest.approx(2000.0, rel=1e-3)  # their sum is what the figures fix


def test_the_constants_stay_in_engine_spec_s_ranges_even_when_the_figures_ask_for_more():
    lo, hi = bounds()
    got = fit(Counted(), [19.0, 1000.0, 10.0], figures([40.0, 2000.0, 10.0]) * np.array([1, 1, 1e-4] * 3))
    assert ((got.theta >= lo) & (got.theta <= hi)).all()
    assert mean_abs(figures(got.theta), figures([40.0, 2000.0, 10.0]) * np.array([1, 1, 1e-4] * 3)) <= got.before


def test_a_search_that_cannot_improve_keeps_the_start():
    start = np.array([19.0, 1000.0, 10.0])
    got = fit(Counted(), start, figures(start))
    assert got.theta == pytest.approx(start) and got.after == got.before == 0.0
