"""A clock profile read back from its file (harness/serving/profile_table.py): every value checked against its
column's range, counts never cast, no point twice, and each refusal one line naming the file, row, column and
value; through a job, a refused table is an error row, never an ``ok`` one."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from kvbench.harness.errors import ConfigError
from kvbench.harness.front.job import run_job
from kvbench.harness.serving.profile_table import MAX_STEP_S, MIN_STEP_S, clock_from_table, read_profile_table

IMPL = "paged_torch"


def _rows() -> list[dict]:
    """A valid profile of two decode batches and two prefill sizes (rows 1-4)."""
    def decode(batch: int, seconds: float) -> dict:
        return {"impl": IMPL, "kind": "decode", "batch": batch, "context": 10.0, "tokens": None, "seconds": seconds,
                "seconds_p10": seconds * 0.9, "seconds_p90": seconds * 1.1, "samples": 9,
                "attention_seconds": seconds / 4, "attention_share": 0.25}

    def prefill(tokens: int, seconds: float) -> dict:
        return {"impl": IMPL, "kind": "prefill", "batch": None, "context": None, "tokens": tokens,
                "seconds": seconds, "seconds_p10": seconds * 0.9, "seconds_p90": seconds * 1.1, "samples": 9,
                "attention_seconds": seconds / 4, "attention_share": 0.25}

    return [decode(1, 0.002), decode(4, 0.003), prefill(16, 0.004), prefill(64, 0.008)]


def _with(row: int, **values) -> list[dict]:
    """The valid rows with ``values`` set in row ``row`` (counted from 1, as messages count)."""
    rows = _rows()
    rows[row - 1].update(values)
    return rows


def _write(tmp_path: Path, rows: list[dict], fmt: str = "csv") -> Path:
    path = tmp_path / f"profile.{fmt}"
    df = pd.DataFrame(rows)
    df.to_csv(path, index=False) if fmt == "csv" else df.to_parquet(path, index=False)
    return path


def _refusal(tmp_path: Path, rows: list[dict], fmt: str = "csv") -> str:
    path = _write(tmp_path, rows, fmt)
    with pytest.raises(ConfigError) as e:
        read_profile_table(path)
    message = str(e.value)
    assert "\n" not in message and f"profile.{fmt}" in message  # one line, naming the file
    return message


def test_a_valid_table_reads_back_as_its_points_counts_whole(tmp_path):
    # A CSV holds a column with empty cells as floats (batch 1.0): a whole float is the count it was written as.
    df, source = read_profile_table(_write(tmp_path, _rows()))
    assert source.endswith("profile.csv") and df.loc[0, "batch"] == 1.0
    clock = clock_from_table(df, IMPL, source)
    assert clock.points.decode == ((1, 10.0, 0.002), (4, 10.0, 0.003))
    assert clock.points.prefill == ((16, 0.004), (64, 0.008)) and isinstance(clock.points.prefill[0][0], int)
    assert read_profile_table(tmp_path)[0].equals(df)  # the run folder names the same table


@pytest.mark.parametrize("column, value", [
    ("seconds", 0.0), ("seconds", 1e300),  # the issue's: TPOT 0.0 ms, TTFT 8.6e302 ms, status ok
    ("seconds", -0.001), ("seconds", math.inf), ("seconds", MIN_STEP_S / 10), ("seconds", MAX_STEP_S * 2),
    ("seconds_p10", 0.0), ("seconds_p90", 1e300), ("attention_seconds", 0.0), ("attention_seconds", 1e300),
])
def test_a_step_time_that_is_not_a_plausible_measurement_is_refused(tmp_path, column, value):
    message = _refusal(tmp_path, _with(3, **{column: value}))
    assert f"row 3, column {column}: {float(value)} is not" in message  # the value as written, never rounded
    assert "not a positive, finite measurement in [1e-07, 1000] s (one step's time)" in message


@pytest.mark.parametrize("values, said", [
    ({"seconds_p10": 0.0025}, "seconds_p10=0.0025 > seconds=0.002"),
    ({"seconds_p90": 0.0015}, "seconds=0.002 > seconds_p90=0.0015"),
])
def test_a_median_outside_its_own_p10_p90_is_refused(tmp_path, values, said):
    message = _refusal(tmp_path, _with(1, **values))
    assert f"row 1: {said}" in message and "seconds_p10 <= seconds <= seconds_p90" in message


def test_a_table_without_the_spread_columns_still_reads(tmp_path):
    rows = [{k: v for k, v in r.items() if k not in ("seconds_p10", "seconds_p90", "attention_seconds")}
            for r in _rows()]
    df, source = read_profile_table(_write(tmp_path, rows))
    points = clock_from_table(df, IMPL, source).points
    assert len(points.decode) == 2 and points.prefill_path_s == 0.0  # no attention timed: mixed steps as before


def test_a_mixed_step_is_priced_with_the_smallest_prefills_attention_read_from_the_table(tmp_path):
    df, source = read_profile_table(_write(tmp_path, _rows()[::-1]))  # any row order
    assert clock_from_table(df, IMPL, source).points.prefill_path_s == pytest.approx(0.004 / 4)  # 16 tokens' point


@pytest.mark.parametrize("row, column, value", [
    (2, "batch", 1.5), (3, "tokens", 16.7),  # the issue's: cast to 1 and 16 silently
    (2, "batch", 0), (2, "batch", -2), (3, "tokens", 0), (4, "tokens", -64), (1, "samples", 2.5), (1, "samples", 0),
])
def test_a_count_that_is_not_a_whole_number_from_1_is_refused_never_cast(tmp_path, row, column, value):
    message = _refusal(tmp_path, _with(row, **{column: value}))
    assert f"row {row}, column {column}: {float(value)} is not a whole number from 1 to 2**53" in message


@pytest.mark.parametrize("value", [-3.0, 0.0, math.inf])
def test_a_context_that_is_not_a_positive_finite_number_is_refused(tmp_path, value):
    message = _refusal(tmp_path, _with(1, context=value))
    assert f"row 1, column context: {value} is not a finite number > 0" in message


def test_a_point_with_a_column_its_kind_needs_empty_is_refused(tmp_path):
    assert "row 2, a decode point, has no context" in _refusal(tmp_path, _with(2, context=None))
    assert "row 4, a prefill point, has no tokens" in _refusal(tmp_path, _with(4, tokens=None))


@pytest.mark.parametrize("rows, said", [
    # the issue's: the same decode point twice, the last one silently winning
    (_rows() + [{**_rows()[0], "seconds": 0.5, "seconds_p10": 0.4, "seconds_p90": 0.6}],
     "rows 1, 5 are the same point (impl 'paged_torch', decode, batch 1, context 10)"),
    (_rows() + [{**_rows()[3], "seconds": 0.5, "seconds_p10": 0.4, "seconds_p90": 0.6}],
     "rows 4, 5 are the same point (impl 'paged_torch', prefill, tokens 64)"),
    # a whole float and its int are one point; another impl's duplicate spoils the table too
    ([*_rows(), {**_rows()[1], "batch": 4.0}], "rows 2, 5 are the same point"),
    ([*_rows(), *[{**r, "impl": "other"} for r in _rows()], {**_rows()[2], "impl": "other"}],
     "rows 7, 9 are the same point (impl 'other', prefill, tokens 16)"),
])
def test_a_point_given_twice_is_refused_naming_it(tmp_path, rows, said):
    message = _refusal(tmp_path, rows)
    assert said in message and "a table holds each point once" in message


def test_the_same_point_of_two_impls_is_two_points(tmp_path):
    df, source = read_profile_table(_write(tmp_path, [*_rows(), *[{**r, "impl": "other"} for r in _rows()]]))
    assert clock_from_table(df, "other", source).points == clock_from_table(df, IMPL, source).points


@pytest.mark.parametrize("row, column, value", [
    (3, "seconds", "fast"),  # the issue's: a bare ValueError row
    (2, "batch", "two"), (1, "context", "ten"), (4, "seconds_p90", "slow"), (2, "samples", "many"),
])
def test_a_non_number_in_a_numeric_column_is_one_line_naming_file_row_column_and_value(tmp_path, row, column, value):
    message = _refusal(tmp_path, _with(row, **{column: value}))
    assert message.startswith("clock_profile=") and f"row {row}, column {column}: '{value}' is not a number" in message


def test_a_bool_is_not_a_number(tmp_path):
    rows = [{**r, "seconds": True} for r in _rows()]  # Parquet keeps the column boolean
    assert "row 1, column seconds: True is not a number" in _refusal(tmp_path, rows, "parquet")


def test_an_unknown_kind_or_an_empty_impl_is_refused(tmp_path):
    assert "row 2, column kind: 'Decode' is not a kind of point (allowed: decode, prefill, after_idle, after_busy)" in \
        _refusal(tmp_path, _with(2, kind="Decode"))
    assert "row 1, column impl is empty" in _refusal(tmp_path, _with(1, impl=None))


def test_a_cell_of_any_length_or_with_a_line_break_stays_one_short_line(tmp_path):
    message = _refusal(tmp_path, _with(1, kind="x\n" * 500))
    assert len(message) < 400 and "\\n" in message


def test_clock_from_table_checks_a_frame_given_it_directly():
    df = pd.DataFrame(_with(1, batch=2.5))
    with pytest.raises(ConfigError, match="row 1, column batch: 2.5 is not a whole number"):
        clock_from_table(df, IMPL, "t.csv")


SMALL = ["+impl=paged_torch", "model=tiny-llama", "device=cpu", "max_seq_len=64", "batch=4", "workload=uniform",
         "workload.num_requests=8", "workload.prompt_len=12", "workload.output_len=6", "device.kv_cache_gb=0.001",
         "scenario=capacity", "arrival=poisson", "arrival.rate=20"]


@pytest.mark.parametrize("rows, said", [
    (_with(1, seconds=0.0, seconds_p10=0.0), "column seconds: 0.0 is not a positive, finite measurement"),
    (_with(3, seconds=1e300, seconds_p90=1e300), "column seconds: 1e+300 is not a positive, finite measurement"),
    (_with(2, batch=1.5), "column batch: 1.5 is not a whole number"),
    (_rows() + [_rows()[0]], "rows 1, 5 are the same point"),
    (_with(3, seconds="fast"), "row 3, column seconds: 'fast' is not a number"),
], ids=["zero", "1e300", "fraction", "twice", "text"])
def test_a_refused_table_gives_an_error_row_not_an_ok_one(compose, tmp_path, rows, said):
    (tmp_path / "profile").mkdir()
    _write(tmp_path / "profile", rows)
    (row,), code = run_job(compose([*SMALL, f"clock_profile={tmp_path / 'profile'}"]), tmp_path / "run")
    assert code == 2 and row["status"] == "error" and said in row["error"] and "\n" not in row["error"]
    assert row.get("tpot_ms_p50") is None


def test_a_fifo_in_place_of_the_table_is_refused_not_read(tmp_path):
    import os

    os.mkfifo(tmp_path / "profile.csv")  # read as a table, it would block the run forever
    with pytest.raises(ConfigError, match="profile.csv: cannot read it .*not a regular file"):
        read_profile_table(tmp_path)


def _after_idle(*places_factors, kind: str = "after_idle") -> list[dict]:
    return [{"impl": IMPL, "kind": kind, "place": p, "factor": f, "seconds": 0.002, "samples": 9}
            for p, f in places_factors]


def test_after_busy_rows_read_back_as_the_busy_curve_and_alone_are_refused(tmp_path):
    """The busy prefill's curve (harness/serving/after_idle.py): the after-idle one's second half."""
    idle = _after_idle((0, 1.3), (1, 1.5), (4, 1.0))
    busy = _after_idle((0, 1.2), (1, 1.1), (4, 1.0), kind="after_busy")
    df, source = read_profile_table(_write(tmp_path, _rows() + idle + busy, "parquet"))
    clock = clock_from_table(df, IMPL, source)
    assert clock.after_idle.busy.prefill == 1.2 and clock.after_idle.busy.decode == ((1, 1.1), (4, 1.0))
    without = clock_from_table(read_profile_table(_write(tmp_path, _rows() + idle))[0], IMPL, source)
    assert without.after_idle.busy is None and without.id != clock.id
    for rows, said in ((_rows() + busy, "has after_busy rows but no after_idle ones"),
                       (_rows() + idle + busy[1:], "after_busy rows need place 0 \\(the prefill run between decodes\\)")):
        path = _write(tmp_path, rows)
        with pytest.raises(ConfigError, match=said):
            clock_from_table(read_profile_table(path)[0], IMPL, str(path))


def test_after_idle_rows_read_back_as_the_clocks_factors_and_a_table_without_them_has_none(tmp_path):
    rows = _rows() + _after_idle((0, 1.3), (1, 1.5), (2, 1.2), (3, 1.1), (4, 1.0))
    df, source = read_profile_table(_write(tmp_path, rows, "parquet"))
    clock = clock_from_table(df, IMPL, source)
    assert clock.after_idle.prefill == 1.3 and clock.after_idle.decode == ((1, 1.5), (2, 1.2), (3, 1.1), (4, 1.0))
    plain = clock_from_table(read_profile_table(_write(tmp_path, _rows()))[0], IMPL, source)
    assert plain.after_idle is None and plain.id != clock.id  # the factors are part of the profile's identity


@pytest.mark.parametrize("extra, said", [
    (((0, 1.3), (1, 9.0)), "row 6, column factor: 9.0 is not a price factor in [0.2, 5]"),
    (((0, 1.3), (1, 0.0)), "row 6, column factor: 0.0 is not a price factor"),
    (((0, 1.3), (1.5, 1.0)), "row 6, column place: 1.5 is not a whole number from 0"),
    (((0, 1.3), (1, 1.0), (1, 1.1)), "rows 6, 7 are the same point (impl 'paged_torch', after_idle, place 1)"),
    (((1, 1.0), (2, 1.0)), "after_idle rows need place 0 (the prefill after a sleep) and place 1"),
    (((0, 1.3), (2, 1.0)), "it has places 0, 2"),
])
def test_a_malformed_after_idle_row_is_refused_in_one_line(tmp_path, extra, said):
    rows = _rows() + _after_idle(*extra)
    path = _write(tmp_path, rows)
    with pytest.raises(ConfigError) as e:
        clock_from_table(read_profile_table(path)[0], IMPL, str(path))
    assert said in str(e.value) and "\n" not in str(e.value)
