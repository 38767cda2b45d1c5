"""The one percentile (harness.measure.metrics.percentiles): numpy's, and the figures it replaced.

The hand-written versions it replaced are kept here, verbatim, to compare against: the linear
one (metrics.percentile and service_metrics.weighted_percentiles, ``a + (b - a) * t``) and the
profile table's nearest one."""

import math
import random

import numpy as np
import pytest

from kvbench.harness.measure.metrics import percentile, percentiles
from kvbench.harness.serving.profile_table import _quantile
from kvbench.harness.serving.service_metrics import weighted_percentiles

QS = (0, 1, 10, 25, 50, 75, 90, 95, 99, 99.9, 100)


def old_linear(values, q):  # harness/measure/metrics.py before numpy
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def old_nearest(values, q):  # harness/serving/profile_table.py's _quantile before numpy
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def draw(rng, n):
    return [rng.lognormvariate(-4, 1.5) for _ in range(n)]


@pytest.mark.parametrize("seed", range(20))
def test_linear_is_numpys_and_the_old_figure(seed):
    rng = random.Random(seed)
    for n in (1, 2, 3, 7, 100, rng.randint(1, 500)):
        values = draw(rng, n)
        qs = [*QS, rng.uniform(0, 100)]
        got = percentiles(values, qs)
        assert got == [float(v) for v in np.percentile(values, qs)]  # bit for bit numpy's (and vLLM's)
        assert got == [percentile(values, q) for q in qs]
        # the old a + (b - a) * t and numpy's two-sided lerp differ at most in the last bits
        assert got == pytest.approx([old_linear(values, q) for q in qs], rel=1e-12, abs=0)


def test_linear_exact_where_no_rounding_is_involved():
    assert percentile([3, 1, 2], 50) == 2.0 and isinstance(percentile([3, 1, 2], 50), float)
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5 == old_linear([1.0, 2.0, 3.0, 4.0], 50)
    assert percentile([5.0], 99) == 5.0
    assert percentile([], 50) is None and percentiles([], [50, 90]) == [None, None]


@pytest.mark.parametrize("seed", range(20))
def test_counted_is_numpys_of_the_expanded_multiset_bit_for_bit(seed):
    rng = random.Random(seed)
    k = rng.randint(1, 40)
    values = draw(rng, k)
    counts = [rng.choice([0, 1, 1, 2, 5, 100, 3000]) for _ in range(k)]
    qs = [*QS, rng.uniform(0, 100)]
    expanded = np.repeat(values, counts)
    got = weighted_percentiles(values, counts, qs)
    if not len(expanded):
        assert got == [None] * len(qs)
        return
    assert got == [float(v) for v in np.percentile(expanded, qs)]
    assert got == percentiles(values, qs, counts)
    assert got == pytest.approx([old_linear(list(expanded), q) for q in qs], rel=1e-12, abs=0)


def test_counted_large_counts_are_never_expanded():
    got = percentiles([1.0, 2.0], [0, 50, 100], counts=[10**12, 10**12])
    assert got == [1.0, 1.5, 2.0]
    with pytest.raises(ValueError):
        percentiles([1.0], [50], counts=[1], method="nearest")


@pytest.mark.parametrize("q", [0.1, 0.9, 0.5, 0.25, 0.75])
def test_profile_quantile_is_the_old_nearest_sample(q):
    rng = random.Random(int(q * 100))
    for n in range(1, 60):  # every n, so every tie of (n - 1) * q at .5 is met (half to even, as before)
        values = draw(rng, n)
        got = _quantile(values, q)
        assert got == old_nearest(values, q)
        assert got in values  # a measured sample, not a point between two
