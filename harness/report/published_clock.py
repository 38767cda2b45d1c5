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

from kvbench.harness.measure.error_groups import PointError, error_groups, gpu_label
from kvbench.harness.report.tables import md_table

ERRORS = Path(__file__).resolve().parents[2] / "docs" / "validation" / "clock_errors.csv"
TITLE = "The simulated GPU clock against published real-GPU figures"


def _groups(df: pd.DataFrame) -> pd.DataFrame:
    """The error table's lines (harness/measure/error_groups.py) from clock_errors.csv's priced rows."""
    points = (PointError(r.metric, gpu_label(r.gpu, int(r.gpu_count)), r.split, float(r.error_pct))
              for r in df.itertuples(index=False))
    return pd.DataFrame([{"group": "all" if g.by == "all" else f"{g.by}: {g.key}", "points": g.count,
                          "median |error|": f"{g.median_abs_pct:.1f}%", "median signed": f"{g.median_signed_pct:+.1f}%"}
                         for g in error_groups(points)])


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
