"""A run folder's tables: the CSV and the Parquet twin always agree; a failed write is one line and changes nothing."""

from __future__ import annotations

import pandas as pd
import pytest

from kvbench.harness.results import TableWriteError, write_run, write_table


def test_a_row_parquet_cannot_hold_as_it_is_is_kept_as_text(tmp_path):
    write_run(tmp_path, [{"scenario": "decode", "status": "error", "seed": 99999999999999999999999, "impl": "x"}])
    pq, csv = pd.read_parquet(tmp_path / "rows.parquet"), pd.read_csv(tmp_path / "rows.csv")
    assert pq.loc[0, "seed"] == "99999999999999999999999" and str(csv.loc[0, "seed"]) == "99999999999999999999999"


@pytest.mark.parametrize("fail_in, error", [
    ("to_parquet", OSError(28, "No space left on device")),
    ("to_csv", OSError(28, "No space left on device")),
    ("to_parquet", MemoryError()),
    ("to_parquet", OverflowError("Python int too large to convert to C long")),
    ("to_csv", PermissionError(13, "Permission denied")),
])
def test_a_failed_write_leaves_the_earlier_pair_whole(tmp_path, monkeypatch, fail_in, error):
    before = pd.DataFrame([{"scenario": "decode", "status": "interrupted", "impl": "a"}])
    write_table(before, tmp_path / "rows")

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(pd.DataFrame, fail_in, fail)
    after = pd.DataFrame([{"scenario": "decode", "status": "ok", "impl": "a"}])
    with pytest.raises(TableWriteError) as err:
        write_table(after, tmp_path / "rows")
    monkeypatch.undo()
    assert "\n" not in str(err.value) and "could not be written" in str(err.value)
    # Neither table claims the success the write did not reach, and no temporary file is left.
    assert pd.read_csv(tmp_path / "rows.csv").loc[0, "status"] == "interrupted"
    assert pd.read_parquet(tmp_path / "rows.parquet").loc[0, "status"] == "interrupted"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.csv", "rows.parquet"]


def test_a_job_whose_rows_cannot_be_written_ends_in_one_line(compose, tmp_path, monkeypatch, capsys):
    from kvbench.harness.front.job import run_job

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", full)
    rows, code = run_job(compose(["+impl=paged_torch", "model=tiny-llama", "max_seq_len=48", "batch=2",
                                  "workload.prompt_len=8", "workload.output_len=2", "scenario.warmup=0"]), tmp_path)
    monkeypatch.undo()
    assert code == 1 and rows[0]["status"] == "error" and "No space left on device" in rows[0]["error"]
    assert "No space left on device" in capsys.readouterr().err
    assert not (tmp_path / "rows.csv").exists()  # no rows.csv saying ok beside a missing rows.parquet


def test_tidy_rows_store_counts_as_integers_and_flags_as_booleans(tmp_path):
    import pandas as pd

    from kvbench.harness.results import tidy, write_table

    rows = [{"scenario": "decode", "status": "ok", "batch": 8, "kv_bytes_reserved": 1.2e9, "preemptions": 0,
             "git_dirty": False, "contended": "True", "tokens_per_s": 812.5, "measured_at": "2026-12-01T22:00:00+00:00"},
            {"scenario": "decode", "status": "error", "error": "x", "batch": 16, "git_dirty": True}]
    df = tidy(rows)
    assert str(df["batch"].dtype) == "Int64" and str(df["kv_bytes_reserved"].dtype) == "Int64"
    assert str(df["preemptions"].dtype) == "Int64" and df["preemptions"].isna().tolist() == [False, True]
    assert str(df["git_dirty"].dtype) == "boolean" and str(df["contended"].dtype) == "boolean"
    assert df["contended"].tolist()[0] is True or bool(df["contended"].iloc[0]) is True
    assert df["tokens_per_s"].dtype == float  # a rate stays a float
    write_table(df, tmp_path / "rows")
    back = pd.read_parquet(tmp_path / "rows.parquet")
    assert str(back["batch"].dtype) == "Int64" and str(back["git_dirty"].dtype) == "boolean"
    assert (tmp_path / "rows.csv").read_text().splitlines()[1].count("1200000000") == 1  # no "1200000000.0"
    assert "measured_at" in df.columns


def test_a_count_column_with_a_fraction_is_left_as_it_is():
    from kvbench.harness.results import tidy

    df = tidy([{"scenario": "capacity", "status": "ok", "max_concurrency_analytic": 12.5},
               {"scenario": "capacity", "status": "ok", "max_concurrency_analytic": 3}])
    assert df["max_concurrency_analytic"].tolist() == [12.5, 3.0]  # never rounded to fit a type
