"""selection.measured_as: a validating profile job's wall rows count as what they measured."""

import pandas as pd

from kvbench.harness.report.selection import measured_as

ROWS = pd.DataFrame([
    {"status": "ok", "scenario": "decode", "clock": "wall", "request_rate": 10.0, "max_rate_rps": None},
    {"status": "error", "scenario": "decode", "clock": "wall", "request_rate": 20.0, "max_rate_rps": None},
    {"status": "ok", "scenario": "profile", "clock": None, "request_rate": None, "max_rate_rps": None},  # its summary
    {"status": "ok", "scenario": "profile", "clock": "wall", "request_rate": 10.0, "max_rate_rps": None},
    {"status": "ok", "scenario": "profile", "clock": "simulated", "request_rate": 10.0, "max_rate_rps": None},
    {"status": "ok", "scenario": "profile", "clock": "wall", "request_rate": 15.0, "max_rate_rps": 15.0},
    {"status": "ok", "scenario": "profile", "clock": "simulated", "request_rate": None, "max_rate_rps": 17.5},
    {"status": "ok", "scenario": "max_rate", "clock": "wall", "request_rate": 12.5, "max_rate_rps": 12.5},
])


def test_served_rates_are_decode_rows_and_a_profile_jobs_wall_runs():
    got = measured_as(ROWS, "decode")
    assert sorted(zip(got.scenario, got.request_rate)) == [("decode", 10.0), ("profile", 10.0)]


def test_searches_are_max_rate_rows_and_a_profile_jobs_wall_search():
    got = measured_as(ROWS, "max_rate")
    assert sorted(zip(got.scenario, got.max_rate_rps)) == [("max_rate", 12.5), ("profile", 15.0)]


def test_other_scenarios_are_their_own_ok_rows():
    assert measured_as(ROWS, "profile")["clock"].tolist()[1:] == ["wall", "simulated", "wall", "simulated"]
    assert measured_as(ROWS.drop(columns="clock"), "decode")["scenario"].tolist() == ["decode"]
