"""collect.measured_as: a validating profile job's wall rows count as what they measured."""

import pandas as pd

from harness.report.collect import measured_as

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


def test_concat_keeps_every_row_in_order_across_column_sets():
    """Frames are joined set of columns by set of columns (faster), then put back in their order: the result
    equals one plain concatenation of them all, values and types."""
    import random

    from harness.report.collect import concat, numeric

    rng = random.Random(7)
    shapes = [("scenario", "status", "wall_s"), ("scenario", "status", "batch", "notes"), ("status", "batch")]
    frames = []
    for i in range(40):
        cols = shapes[rng.randrange(len(shapes))]
        n = rng.randint(1, 3)
        data = {c: ([f"{c}{i}"] * n if c in ("scenario", "status", "notes") else [i + 0.5 * k for k in range(n)])
                for c in cols}
        if "notes" in cols and i % 2:
            data["notes"] = [None] * n  # an all-empty column in this frame: dropped, then typed at the end
        frames.append(pd.DataFrame(data).assign(run_dir=f"r{i}"))
    got = concat(frames, ["run_dir", "scenario"])
    plain = pd.concat([f.dropna(axis=1, how="all") for f in frames], ignore_index=True, sort=False)
    expected = numeric(plain.reindex(columns=list(got.columns)))
    pd.testing.assert_frame_equal(got, expected)
    assert list(got["run_dir"]) == [f"r{i}" for i, f in enumerate(frames) for _ in range(len(f))]
