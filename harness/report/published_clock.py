"""The report's section on the simulated GPU clock against published real-GPU figures.

``make clock-check`` (harness/front/clock_check.py) prices every point of kvbench's public validation set and writes
docs/validation/clock_errors.csv; this section reads that table (the project's own, beside the code, not a run's
results) and shows the median errors by metric, GPU and split, so a report says how far the simulated clock is to be
trusted on a card nobody here ran. Only a report with rows priced on the simulated GPU clock (``clock_source``
roofline-v*) gets it; no table, no section.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from kvbench.harness.report.tables import md_table

ERRORS = Path(__file__).resolve().parents[2] / "docs" / "validation" / "clock_errors.csv"
TITLE = "The simulated GPU clock against published real-GPU figures"


def _groups(df: pd.DataFrame) -> pd.DataFrame:
    """Each group's count, median |error| and median signed error (percent), as clock_check_table.summarize."""
    gpu = df["gpu"].where(df["gpu_count"] == 1, df["gpu_count"].astype(str) + " x " + df["gpu"])
    out = [("all", df)] + [(f"metric: {k}", g) for k, g in df.groupby("metric")] + \
        [(f"gpu: {k}", g) for k, g in df.groupby(gpu)] + [(f"split: {k}", g) for k, g in df.groupby("split")]
    return pd.DataFrame([{"group": name, "points": len(g), "median |error|": f"{g['abs_error_pct'].median():.1f}%",
                          "median signed": f"{g['error_pct'].median():+.1f}%"} for name, g in out])


def priced_on_a_gpu(rows: pd.DataFrame) -> bool:
    """Whether any row was priced by the roofline (a GPU named: ``gpu=NAME``)."""
    return "clock_source" in rows and rows["clock_source"].astype(str).str.startswith("roofline").any()


def published_clock_section(rows: pd.DataFrame, path: Path = ERRORS) -> list[str]:
    if not priced_on_a_gpu(rows) or not path.is_file():
        return []
    df = pd.read_csv(path)
    priced = df[pd.to_numeric(df["error_pct"], errors="coerce").notna()]
    if priced.empty:
        return []
    return [f"## {TITLE}\n",
            f"{len(priced)} of {len(df)} published points (vendor and engine performance pages, benchmark posts; each "
            "with its source, engine, GPU, model and workload) priced by kvbench's own command line "
            "(`make clock-check`; the points, commands and sources: docs/clock_validation.md). Error = simulated / "
            "published - 1: negative is a latency priced too fast or a throughput too low. The `holdout` rows were "
            "not used to choose any constant.\n",
            md_table(_groups(priced))]
