"""A wall run's own steps' pace against their prices, and the pace meter's miss of it."""

import pandas as pd
import pytest

from kvbench.harness.report.steps_pace import miss_said, steps_pace, with_steps_pace


def _step(start, duration, price, kind="decode", unit=None, rate=10.0, chunked=False, run_dir="p/0", place=9):
    """One wall step; ``place`` 0: the first after a sleep, as the job's ``priced`` marks it."""
    return {"run_dir": run_dir, "impl": "paged_cuda", "request_rate": rate, "chunked_prefill": chunked, "kind": kind,
            "start_s": start, "duration_s": duration, "price_s": price, "pace_unit_s": unit, "place": place}


def test_a_steps_time_runs_to_the_next_steps_start_less_a_unit_and_never_across_a_sleep():
    steps = pd.DataFrame([
        _step(0.000, 0.010, 0.010, kind="prefill"),  # not a decode step: its time is not summed
        _step(0.0101, 0.002, 0.002),  # 0.0001 s pause before the next: counted
        _step(0.0122, 0.002, 0.002, unit=0.001),  # a unit of 1 ms, then 0.0001 s: only the pause counts
        _step(0.0153, 0.002, 0.002),  # then a sleep of 0.05 s: not the step's
        _step(0.0673, 0.002, None, place=0),  # the first after the sleep; without a price (a mixed one): not summed
        _step(0.0694, 0.002, 0.004),  # the last step: its duration alone
    ])
    (got,) = steps_pace(steps).to_dict("records")
    assert got["priced_steps"] == 4
    assert got["steps_pace"] == pytest.approx((0.0021 + 0.0021 + 0.002 + 0.002) / 0.010)


def test_each_rate_and_scheduling_is_its_own_and_a_rate_served_twice_sums_both_runs():
    steps = pd.DataFrame([
        _step(0.0, 0.002, 0.001), _step(0.0020, 0.002, 0.001),  # first run of 10 req/s: 2 ms steps back to back
        _step(0.0, 0.003, 0.001), _step(0.0030, 0.003, 0.001),  # the clock goes back: a second run of 10 req/s
        _step(0.0, 0.004, 0.002, chunked=True), _step(0.5, 0.004, 0.002, chunked=True, place=0),
        _step(0.0, 0.001, 0.001, rate=None),  # a decode sweep's step: no rate, never a validation's
    ])
    got = steps_pace(steps).set_index("chunked_prefill")
    assert len(got) == 2
    assert got.loc[False, "steps_pace"] == pytest.approx(0.010 / 0.004)
    assert got.loc[True, "steps_pace"] == pytest.approx(2.0)  # the sleep between them is neither's


def test_nothing_without_prices_or_places():
    assert steps_pace(pd.DataFrame()).empty
    assert steps_pace(pd.DataFrame([_step(0.0, 0.002, 0.001)]).drop(columns="price_s")).empty
    assert steps_pace(pd.DataFrame([_step(0.0, 0.002, 0.001)]).drop(columns="place")).empty  # no sleeps told


def test_each_pair_gets_its_wall_runs_steps_pace_and_the_meters_miss():
    pairs = pd.DataFrame([{"run_dir_wall": "p/0", "impl": "paged_cuda", "request_rate": 10.0, "chunked_prefill": False,
                           "machine_pace": 1.2},
                          {"run_dir_wall": "p/0", "impl": "paged_cuda", "request_rate": 20.0, "chunked_prefill": None,
                           "machine_pace": 1.0}])
    steps = pd.DataFrame([_step(0.0, 0.002, 0.002, place=0), _step(0.5, 0.002, 0.002, place=0)])
    got = with_steps_pace(pairs, steps)
    assert got["steps_pace"].iloc[0] == pytest.approx(1.0) and got["meter_miss"].iloc[0] == pytest.approx(0.2)
    assert got["steps_pace"].isna().iloc[1] and got["meter_miss"].isna().iloc[1]  # no steps of 20 req/s
    assert miss_said(got) == "a median 20% off (from +20% to +20%, 1 wall run)"
    assert with_steps_pace(pairs, None)["meter_miss"].isna().all() and miss_said(with_steps_pace(pairs, None)) is None


def test_the_misses_are_said_machine_by_machine():
    pairs = pd.DataFrame({"device_slug": ["cpu-<i>-2core", "cpu-a-2core", "cpu-a-2core"],
                          "meter_miss": [0.1, -0.05, 0.15]})
    assert miss_said(pairs) == ("a median 10% off (from +10% to +10%, 1 wall run) on cpu-&lt;i>-2core, "
                                "a median 10% off (from -5% to +15%, 2 wall runs) on cpu-a-2core")  # names escaped

