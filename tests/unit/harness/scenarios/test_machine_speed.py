"""The machine's speed around each wall run of a validating profile job: timed before the first run and after each
one, as a median ratio over a few grid points against the whole profile; the run's simulated twin is priced at it."""

from __future__ import annotations

import pytest

from kvbench.harness.scenarios.machine_speed import SpeedProbe, probe_grid
from kvbench.harness.serving.profiled_clock import ProfiledClock, ProfilePoints


def test_the_probe_points_are_the_middle_batch_at_every_other_context_and_the_second_prefill():
    assert probe_grid(([1, 2, 4, 8, 16], [16, 30, 60, 120, 250], [16, 32, 64])) == ([4], [16, 60, 250], [32])
    assert probe_grid(([1], [9], [16])) == ([1], [9], [16])


class _Sampler:
    """GridSampler's surface: a pass appends the given rows (seconds for one decode and one prefill point)."""

    def __init__(self, seconds: list[float]) -> None:
        self.todo, self.passes = list(seconds), []

    def measure_pass(self) -> None:
        self.passes.append(self.todo.pop(0))

    def rows(self, passes: slice) -> list[dict]:
        got = self.passes[passes]
        mid = sorted(got)[len(got) // 2] if len(got) % 2 else sum(got) / len(got)
        return [dict(kind="decode", batch=4, context=20.5, tokens=None, seconds=mid),
                dict(kind="prefill", batch=None, context=None, tokens=32, seconds=3 * mid)]


def _probe(seconds: list[float]) -> SpeedProbe:
    probe = SpeedProbe.__new__(SpeedProbe)
    probe.sampler = _Sampler(seconds)
    return probe


def test_a_timing_before_the_first_wall_run_and_after_each_the_search_left_alone():
    probe, done = _probe([1.0, 1.0, 1.0, 1.0]), []
    tasks = [lambda i=i: done.append((i, len(probe.sampler.passes))) for i in range(4)]  # three runs, a search
    for task in probe.bracket(tasks, runs=3):
        task()
    assert done == [(0, 1), (1, 2), (2, 3), (3, 4)] and probe.sampler.passes == [1.0] * 4


def test_each_runs_speed_is_the_timings_around_it_over_the_whole_profiles():
    probe = _probe([1.0, 1.4, 1.6, 0.9])  # the machine slowed during run 0 and 1, then ran fast
    for _ in range(4):
        probe.sampler.measure_pass()
    profile = [dict(kind="decode", batch=4, context=20.5, tokens=None, seconds=1.0),
               dict(kind="prefill", batch=None, context=None, tokens=32, seconds=3.0),
               dict(kind="decode", batch=8, context=20.5, tokens=None, seconds=2.0)]  # not probed: no part in it
    assert probe.speed(0, profile) == pytest.approx(1.2)
    assert probe.speed(1, profile) == pytest.approx(1.5)
    assert probe.speed(2, profile) == pytest.approx(1.25)
    assert probe.speed(3, profile) is None  # not timed after it


def test_a_scaled_profile_prices_every_step_that_many_times():
    points = ProfilePoints(((1, 20.0, 0.002), (4, 20.0, 0.003), (1, 200.0, 0.004), (4, 200.0, 0.006)),
                           ((16, 0.01), (64, 0.03)))
    clock, slow = ProfiledClock(points), ProfiledClock(points.scaled(1.5))
    for batch, read in ((1, 20), (3, 300), (4, 800)):
        assert slow.decode_s(batch, read) == pytest.approx(1.5 * clock.decode_s(batch, read))
    assert slow.prefill_s(40) == pytest.approx(1.5 * clock.prefill_s(40))
