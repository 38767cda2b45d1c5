"""The machine's pace meter: the model's own dense work as its unit, ticks at most every period and never more
than their share of a run, the pace as a ratio of medians, and a profile's prices scaled by it."""

from __future__ import annotations

import random

import pytest

from kvbench.harness.measure import pace_meter
from kvbench.harness.measure.pace_meter import MAX_SHARE, PERIOD_S, PaceMeter, Unit, model_unit, pace, reference


TINY = ["tiny-llama", "tiny-qwen2", "tiny-mistral", "tiny-qwen3", "tiny-gemma3", "tiny-gpt-oss"]


def _tiny_model(name: str):
    import torch

    from kvbench.harness.model.weights import build_model
    from tests.helpers.models import load_named

    return build_model(load_named(name), torch.float32, "cpu", seed=0)


@pytest.mark.parametrize("name", TINY)  # dense, sliding-window and mixture-of-experts families alike
def test_the_unit_runs_the_models_dense_work_and_times_it(name):
    model = _tiny_model(name)
    calls = []
    for layer in model.layers:  # every layer's MLP runs once a unit, on the fixed rows
        layer.mlp.register_forward_hook(lambda m, args, out: calls.append(tuple(args[0].shape)))
    unit = model_unit(model, rows=3)
    took = unit()
    assert took > 0 and calls == [(3, model.cfg.hidden_size)] * len(model.layers)
    meter = PaceMeter.of_model(model, 0.002)  # its warm-up units are not ticks
    assert meter.ticks == [] and meter.tick() > 0 and len(meter.ticks) == 1


def test_observe_ticks_at_most_every_period_and_within_its_share(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(pace_meter.time, "perf_counter", lambda: now[0])
    cost = [0.001]

    def unit() -> float:  # a unit of ``cost`` seconds on the fake clock
        now[0] += cost[0]
        return cost[0]

    meter = PaceMeter(unit, 0.002)
    for _ in range(5):  # many steps within one period: one tick
        meter.observe(None, None, [])
    assert meter.ticks == [Unit(0.001, 0)]  # after no step's record: no batch known
    now[0] += PERIOD_S - 1e-6
    meter.observe()
    assert len(meter.ticks) == 1
    now[0] += 2e-6
    meter.observe()
    assert len(meter.ticks) == 2
    # a unit as long as a large model's: the next waits until the units are MAX_SHARE of the time between them
    cost[0] = 0.05
    now[0] += PERIOD_S
    meter.observe()
    assert len(meter.ticks) == 3
    now[0] += 0.05 / MAX_SHARE - 1e-3
    meter.observe()
    assert len(meter.ticks) == 3
    now[0] += 2e-3
    meter.observe()
    assert len(meter.ticks) == 4
    start = meter.mark()
    meter.tick()
    assert meter.since(start) == [Unit(0.05, 0)] and meter.since((0, 0)) == meter.ticks


def test_pace_is_the_runs_median_unit_over_the_profiles_after_the_same_batch():
    """A unit reads the state the step before it left (a large batch's: slower); each is set beside the profile's
    after the same batch, linear between its batches, the nearest beyond them, its prefill points' after a prefill."""
    u = [Unit(s) for s in (1.0, 2.0, 2.0, 3.0)]
    assert pace([Unit(2.0), Unit(2.4), Unit(9.0)], u) == pytest.approx(1.2)  # one state: a ratio of medians
    assert pace([], u) is None and pace([Unit(1.0)], []) is None
    profile = [Unit(1.0, 1), Unit(1.2, 1), Unit(1.1, 1), Unit(2.0, 16), Unit(2.2, 16), Unit(0.5, 0)]
    ref = reference(profile)
    assert [ref(b) for b in (1, 16, 32, 0)] == pytest.approx([1.1, 2.1, 2.1, 0.5])
    assert ref(6) == pytest.approx(1.1 + (2.1 - 1.1) / 3)  # a third of the way from batch 1 to 16
    # a run of large batches as fast as the profile: pace 1, where the medians of all units would say 1.9
    run = [Unit(2.1, 16)] * 5 + [Unit(1.1, 1)]
    assert pace(run, profile) == pytest.approx(1.0)
    assert pace([Unit(1.65, 1), Unit(3.15, 16), Unit(3.3, 20)], profile) == pytest.approx(1.5)
    assert reference([Unit(1.0, 4), Unit(3.0, 4)])(0) == 2.0  # no prefill point: all its units'


def test_a_wall_unit_records_the_batch_of_the_decode_step_it_followed(monkeypatch):
    from types import SimpleNamespace

    now = [0.0]
    monkeypatch.setattr(pace_meter.time, "perf_counter", lambda: now[0])
    meter = PaceMeter(lambda: 0.001, 0.002)
    for i, (kind, batch) in enumerate([("prefill", 3)] + [("decode", 7)] * 9 + [("mixed", 5), ("prefill", 2)]):
        now[0] += PERIOD_S * 2
        meter.observe(SimpleNamespace(kind=kind, batch=batch, start_s=0.003 * i, duration_s=0.003), None, [])
    assert [u.batch for u in meter.ticks] == [7, 7, 5, 0]  # from the 8th step since the sleep on


def test_points_at_a_pace_price_every_step_that_many_times_over():
    from kvbench.harness.serving.after_idle import AfterIdle
    from kvbench.harness.serving.profiled_clock import ProfiledClock, ProfilePoints

    rng = random.Random(7)
    for _ in range(20):
        decode = tuple((b, float(c), rng.uniform(1e-3, 9e-3)) for b in (1, 3, 8) for c in (17, 130, 333))
        prefill = tuple((t, rng.uniform(1e-3, 5e-2)) for t in (16, 48, 160, 512))
        after = AfterIdle.from_places({0: 1.3, 1: 1.1}) if rng.random() < 0.5 else None
        points = ProfilePoints(decode, prefill, rng.uniform(0, 1e-3), after)
        k = rng.uniform(0.7, 1.8)
        scaled = points.at_pace(k)
        assert scaled.after_idle == points.after_idle  # ratios: a pace does not move them
        base, paced = ProfiledClock(points), ProfiledClock(scaled)
        for _ in range(10):  # awkward shapes, inside and outside the grid
            b, c, t = rng.randint(1, 11), rng.randint(1, 600), rng.randint(1, 700)
            assert paced.decode_s(b, c) == pytest.approx(k * base.decode_s(b, c))
            assert paced.prefill_s(t) == pytest.approx(k * base.prefill_s(t))
        assert points.at_pace(1.0) == points


def test_a_wall_run_ticks_only_once_the_engine_has_settled_after_a_sleep(monkeypatch):
    """The steps right after a sleep run cold, and so would a unit timed after them: no tick before SETTLED steps
    back to back; a gap of MIN_IDLE_S or more (a sleep) or a new run's clock (starting again from 0) counts again."""
    from types import SimpleNamespace

    from kvbench.harness.measure.pace_meter import SETTLED
    from kvbench.harness.serving.after_idle import MIN_IDLE_S

    now = [0.0]
    monkeypatch.setattr(pace_meter.time, "perf_counter", lambda: now[0])
    unit_s = 0.0025  # longer than MIN_IDLE_S: a tick's own time must not read as a sleep
    meter = PaceMeter(lambda: unit_s, MIN_IDLE_S)
    t = [5.0]

    def step(gap: float = 1e-4) -> bool:
        """One step ``gap`` after the last one's end (and after the unit, if one was timed after it); True if the
        meter ticked after it."""
        t[0] += gap
        rec = SimpleNamespace(start_s=t[0], duration_s=0.003)
        t[0] += 0.003
        now[0] += 10 * PERIOD_S  # every step due a tick, as far as the period goes
        before = len(meter.ticks)
        meter.observe(rec, None, [])
        ticked = len(meter.ticks) > before
        t[0] += unit_s if ticked else 0.0  # the unit's time passes on the run's clock too
        return ticked

    assert not any(step() for _ in range(SETTLED))  # the first SETTLED steps of a run (places 0 .. SETTLED - 1)
    assert step() and step()  # settled: the gap that held the unit is no sleep
    assert not step(MIN_IDLE_S + 1e-4)  # a sleep: cold again
    assert not any(step() for _ in range(SETTLED - 1)) and step()
    t[0] = 0.0  # the next run's clock
    assert not step()
    assert len(meter.ticks) == 3


def test_units_are_placed_after_the_steps_of_the_last_run_they_followed(monkeypatch):
    """A wall run's steps table marks each unit timed between two of its steps (its step's row), so that the gap
    it left is not read as a sleep; a repeat's run before the last one (its table is the last one's) is not."""
    from types import SimpleNamespace

    from kvbench.harness.measure.pace_meter import SETTLED

    now = [0.0]
    monkeypatch.setattr(pace_meter.time, "perf_counter", lambda: now[0])
    meter = PaceMeter(lambda: 0.001, 0.002)
    meter.tick()  # a profile's, between its points
    start = meter.mark()

    def run(steps: int) -> None:
        for i in range(steps):
            now[0] += PERIOD_S if i % 3 == 0 else 0.0  # a period passes every third step
            meter.observe(SimpleNamespace(start_s=0.004 * i, duration_s=0.0039), None, [])

    run(SETTLED + 7)  # due from the start; settled at SETTLED; then due again at SETTLED + 1 and + 4
    assert meter.after_steps(start) == {SETTLED: 0.001, SETTLED + 1: 0.001, SETTLED + 4: 0.001}
    run(SETTLED + 4)  # the next repeat: its clock starts again
    assert meter.after_steps(start) == {SETTLED: 0.001, SETTLED + 1: 0.001}
    assert len(meter.since(start)) == 5 and meter.after[0] is None
