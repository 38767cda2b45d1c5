"""Real jobs, run in-process, write only declared columns, each value of its declared type, in the schema's order."""

from __future__ import annotations

import pandas as pd
import pytest

from kvbench.harness.front.job import run_job
from kvbench.harness.results import COLUMNS
from kvbench.harness.results.column import fits
from kvbench.harness.results.schema import BY_NAME, column, extra_columns

TINY = ["model=tiny-llama", "max_seq_len=64", "batch=4", "workload.num_requests=6", "workload.prompt_len=8",
        "workload.output_len=4"]
JOBS = {
    "capacity": ["+impl=paged_torch", "scenario=capacity", *TINY, "scenario.concurrency_points=[2]"],
    "capacity_simulated": ["+impl=paged_torch", "scenario=capacity", *TINY, "gpu=a100-40gb", "arrival=poisson",
                           "arrival.rate=2", "slo=interactive", "scenario.concurrency_points=[2]"],
    "decode": ["+impl=paged_torch", *TINY, "scenario.warmup=0"],
    "decode_contiguous": ["+impl=contiguous", *TINY, "scenario.warmup=0"],
    "kernel": ["+impl=contiguous", "scenario=kernel", "model=tiny-llama", "dtype=float32", "batch=3",
               "scenario.context_len=37", "scenario.warmup=1", "scenario.iters=2"],
}


@pytest.mark.parametrize("job", list(JOBS))
def test_a_jobs_row_is_declared_typed_and_in_the_schemas_order(compose, tmp_path, job):
    rows, code = run_job(compose(JOBS[job]), tmp_path)
    assert code == 0 and all(r["status"] == "ok" for r in rows), rows[0].get("error")
    for row in rows:
        undeclared = sorted(k for k in row if k not in BY_NAME)
        assert not undeclared, f"{job} row columns harness/results/schema.py does not declare: {undeclared}"
        misfits = {k: v for k, v in row.items() if not fits(column(k), v)}
        assert not misfits, f"{job} row values not of their declared type: " + ", ".join(
            f"{k}={v!r} (declared {column(k).dtype})" for k, v in misfits.items())
    for table in (pd.read_csv(tmp_path / "rows.csv"), pd.read_parquet(tmp_path / "rows.parquet")):
        header = list(table.columns)
        assert header[:len(COLUMNS)] == COLUMNS
        assert set(header[len(COLUMNS):]) <= set(extra_columns())  # those carried after, each declared
    stored = pd.read_parquet(tmp_path / "rows.parquet")
    for name in stored.columns:
        c = column(name)
        if stored[name].notna().any() and (c.stored_as_integer or c.stored_as_boolean):
            assert str(stored[name].dtype) == ("Int64" if c.stored_as_integer else "boolean"), name
