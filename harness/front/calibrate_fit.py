"""Fitting an engine profile's constants to published figures with few simulations (``kvbench calibrate``).

Each simulation is a kvbench run of seconds, so the fit cannot search blindly. It uses what the engine profile's
formulas say (harness/serving/engine_profile.py): TTFT and E2EL carry the front-end cost ``fe`` as a sum, and a
step's host cost ``o + c*S`` adds to TTFT, TPOT and ITL, so the figures are nearly linear in the constants (a
throughput is one over a step time: smooth). One round:

1. price the fit points at the current constants and at one probe per constant (a step of ``STEPS`` toward the inside
   of its range): a finite-difference Jacobian, ``1 + len(constants)`` simulations per file;
2. on that linear model, find the constants within their ranges (EngineSpec's ``TIME_LIMITS``) that minimize the mean
   |relative error| over the fit points (``solve_box_l1``: iteratively reweighted least squares, each weighted problem
   solved exactly on the box);
3. price them: keep them if the true mean error fell (else try half the step once); stop when the linear model
   predicted the new error (another round would land on the same constants), when the error stops falling, or after
   ``rounds``.

A constant the figures do not move (``seq_overhead_us`` when every file ran the same batch; ``step_overhead_us``
under async scheduling, when the GPU's work hides it) stays where it was: a small ridge on the step keeps it there.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from kvbench.harness.front.calibrate_price import DECIMALS, FITTED
from kvbench.harness.serving.engine_profile import TIME_LIMITS

# Each constant's probe: big enough to move a figure well past the clock's rounding, small against its range.
STEPS = {"frontend_ms": 10.0, "step_overhead_us": 500.0, "seq_overhead_us": 20.0}
RIDGE = 1e-6  # on the step, in probe units: decides only a constant no figure moves
TOL = 1e-3  # mean |relative error|: a change below this is no change

# thetas -> the simulated figures of the fit points, one row per constants vector.
Evaluate = Callable[[Sequence[np.ndarray]], np.ndarray]


@dataclass(frozen=True)
class Fit:
    """The constants found (FITTED order), the fit points' mean |relative error| before and after, and each
    priced step of the search (constants, mean error)."""

    theta: np.ndarray
    before: float
    after: float
    trail: list[tuple[tuple[float, ...], float]] = field(default_factory=list)


def bounds(names: Sequence[str] = FITTED) -> tuple[np.ndarray, np.ndarray]:
    """Each constant's allowed range: EngineSpec's (0 up to a bound that catches a unit slip)."""
    return np.zeros(len(names)), np.array([TIME_LIMITS[n] for n in names], dtype=float)


def relative_errors(simulated: np.ndarray, published: np.ndarray) -> np.ndarray:
    return (np.asarray(simulated, dtype=float) - published) / published


def mean_abs(simulated: np.ndarray, published: np.ndarray) -> float:
    return float(np.mean(np.abs(relative_errors(simulated, published))))


def box_least_squares(a: np.ndarray, b: np.ndarray, lo: np.ndarray, hi: np.ndarray, ridge: float) -> np.ndarray:
    """argmin |a x - b|^2 + ridge |x|^2 over lo <= x <= hi, exactly: the optimum of this strictly convex problem is
    the unconstrained optimum of its free unknowns with the others at a bound, for some split into free, at lo and at
    hi; every split is tried (3^n of them: n is 3) and the best one within the box kept."""
    n = a.shape[1]
    best, best_f = np.clip(np.zeros(n), lo, hi), np.inf
    for state in itertools.product((0, -1, 1), repeat=n):
        s = np.array(state)
        x = np.where(s == -1, lo, np.where(s == 1, hi, 0.0))
        free = s == 0
        if free.any():
            af = a[:, free]
            rhs = b - a[:, ~free] @ x[~free]
            x[free] = np.linalg.solve(af.T @ af + ridge * np.eye(int(free.sum())), af.T @ rhs)
            if (x[free] < lo[free] - 1e-12).any() or (x[free] > hi[free] + 1e-12).any():
                continue
        f = float(np.sum((a @ x - b) ** 2) + ridge * np.sum(x ** 2))
        if f < best_f:
            best, best_f = x, f
    return best


def solve_box_l1(a: np.ndarray, b: np.ndarray, lo: np.ndarray, hi: np.ndarray, ridge: float = RIDGE,
                 iterations: int = 100) -> np.ndarray:
    """argmin sum|a x - b| (+ a small ridge) over lo <= x <= hi, by iteratively reweighted least squares."""
    x = box_least_squares(a, b, lo, hi, ridge)
    for _ in range(iterations):
        w = np.sqrt(1.0 / np.maximum(np.abs(a @ x - b), 1e-6))
        nxt = box_least_squares(a * w[:, None], b * w, lo, hi, ridge)
        if np.max(np.abs(nxt - x)) < 1e-9:
            return nxt
        x = nxt
    return x


def _step(theta: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return np.round(np.clip(theta, lo, hi), DECIMALS)


def fit(evaluate: Evaluate, theta0: Sequence[float], published: Sequence[float], rounds: int = 3,
        names: Sequence[str] = FITTED) -> Fit:
    """The constants (``names`` order, starting from ``theta0``) that minimize the fit points' mean |relative
    error| (module docstring: the search)."""
    pub = np.asarray(published, dtype=float)
    lo, hi = bounds(names)
    scale = np.array([STEPS[n] for n in names])
    theta = _step(np.asarray(theta0, dtype=float), lo, hi)
    v = np.asarray(evaluate([theta])[0], dtype=float)
    err = before = mean_abs(v, pub)
    trail = [(tuple(map(float, theta)), err)]
    for _ in range(rounds):
        h = np.where(theta + scale <= hi, scale, -scale)  # toward the inside of the range
        probes = [_step(theta + h[i] * np.eye(len(names))[i], lo, hi) for i in range(len(names))]
        rows = np.asarray(evaluate(probes), dtype=float)
        jac = ((rows - v) / (np.array([p[i] - theta[i] for i, p in enumerate(probes)])[:, None])).T  # d value/d theta
        a = jac * scale / pub[:, None]  # relative change of each figure per probe step
        u = solve_box_l1(a, (pub - v) / pub, (lo - theta) / scale, (hi - theta) / scale)
        cand = _step(theta + u * scale, lo, hi)
        if np.array_equal(cand, theta):
            break
        predicted = mean_abs(v + jac @ (cand - theta), pub)
        vc = np.asarray(evaluate([cand])[0], dtype=float)
        got = mean_abs(vc, pub)
        trail.append((tuple(map(float, cand)), got))
        if got >= err:  # the linear model overshot: half the step, once
            cand = _step(theta + (cand - theta) / 2, lo, hi)
            vc = np.asarray(evaluate([cand])[0], dtype=float)
            got = mean_abs(vc, pub)
            trail.append((tuple(map(float, cand)), got))
            if got >= err:
                break
        gain = err - got
        theta, v, err = cand, vc, got
        if gain < TOL or abs(got - predicted) < TOL:  # converged, or the model was right: a new round lands here
            break
    return Fit(theta, before, err, trail)
