"""The memory table never files a contiguous cache over the budget under "fits"."""

from __future__ import annotations

import pandas as pd

from kvbench.harness.report.markdown import memory_points_table


def _points(budget: float) -> pd.DataFrame:
    return pd.DataFrame([{"run_dir": "r", "model": "llama-3.1-8b", "workload": "fixed", "budget_kv_bytes": budget,
                          "concurrency": c, "variant": v, "kv_bytes_reserved": per * c, "kv_bytes_used": 1.0}
                         for c in (32, 64) for v, per in (("contiguous", 0.5375e9), ("paged", 0.27e9))])


def test_a_contiguous_cache_over_the_budget_at_the_fewest_requests_is_said_not_to_fit():
    (row,) = memory_points_table(_points(10.6e9)).to_dict("records")
    assert row["requests"] == 32 and row["contiguous GB"] > row["KV budget GB"]
    assert row["contiguous fits the budget"].startswith("no")


def test_one_that_fits_says_so_at_the_most_requests_within_the_budget():
    (row,) = memory_points_table(_points(40e9)).to_dict("records")
    assert row["requests"] == 64 and row["contiguous fits the budget"] == "yes"
