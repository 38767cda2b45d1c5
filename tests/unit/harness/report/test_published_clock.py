"""The report's section on the GPU clock's published-point errors (harness/report/published_clock.py)."""

from __future__ import annotations

import csv

import pandas as pd

from kvbench.harness.front.clock_check_table import RESULT_COLUMNS
from kvbench.harness.report.published_clock import ERRORS, published_clock_section

PRICED = pd.DataFrame({"clock_source": ["roofline-v8", "wall"]})


def _write(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=RESULT_COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "") for c in RESULT_COLUMNS})


def test_the_medians_by_metric_gpu_and_split_and_unpriced_points_counted_not_summarized(tmp_path):
    rows = [dict(id="a", split="fit", gpu="h200", gpu_count=1, metric="output_tok_s", error_pct=-10, abs_error_pct=10),
            dict(id="b", split="holdout", gpu="h200", gpu_count=2, metric="output_tok_s", error_pct=4, abs_error_pct=4),
            dict(id="c", split="fit", gpu="l4", gpu_count=1, metric="ttft_ms_p50", error_pct=30, abs_error_pct=30),
            dict(id="d", split="fit", gpu="l4", gpu_count=1, metric="ttft_ms_p50", reason="no conf/model/x.yaml")]
    _write(tmp_path / "e.csv", rows)
    text = "\n".join(published_clock_section(PRICED, tmp_path / "e.csv"))
    assert "3 of 4 published points" in text
    assert "| all | 3 | 10.0% | +4.0% |" in text
    assert "| metric: output_tok_s | 2 | 7.0% | -3.0% |" in text and "| gpu: 2 x h200 | 1 | 4.0% | +4.0% |" in text
    assert "| split: holdout | 1 | 4.0% | +4.0% |" in text


def test_no_table_or_no_simulated_gpu_row_no_section(tmp_path):
    assert published_clock_section(PRICED, tmp_path / "missing.csv") == []
    assert ERRORS.is_file() and published_clock_section(PRICED)  # the project's own table is shipped
    assert published_clock_section(pd.DataFrame({"clock_source": ["wall", "profile-abc"]})) == []
    assert published_clock_section(pd.DataFrame({"impl": ["paged"]})) == []
