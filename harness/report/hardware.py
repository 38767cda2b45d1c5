"""Peak memory bandwidth by GPU, to put results from different GPUs on one scale."""

from __future__ import annotations

import math
import re

import pandas as pd

# Datasheet HBM/GDDR bandwidth in TB/s. Matched in order against the slugified GPU name
# (or device slug): every token must appear, so list the more specific entries first.
PEAK_TBPS: list[tuple[tuple[str, ...], float]] = [
    (("h200",), 4.8),
    (("h100", "nvl"), 3.9),
    (("h100", "pcie"), 2.0),
    (("h100",), 3.35),  # SXM (torch names it "NVIDIA H100 80GB HBM3")
    (("a100", "80gb", "pcie"), 1.94),
    (("a100", "80gb"), 2.0),  # SXM
    (("l40s",), 0.864),
    (("4090",), 1.008),
]


def _tokens(name: str) -> list[str]:
    """``NVIDIA H100 80GB HBM3`` -> [nvidia, h100, 80gb, hbm3] (the words of its device slug)."""
    return [t for t in re.split(r"[^a-z0-9]+", name.lower()) if t]


def table_peak_tbps(name: str | None) -> float:
    if not isinstance(name, str) or not name:
        return math.nan
    tokens = _tokens(name)
    for needles, tbps in PEAK_TBPS:
        if all(n in tokens for n in needles):
            return tbps
    return math.nan


def peak_tbps(row: pd.Series) -> float:
    """The table's figure for the row's GPU, else the row's own peak_bw_gbps, else NaN."""
    for key in ("gpu_name", "device_slug"):
        tbps = table_peak_tbps(row.get(key))
        if not math.isnan(tbps):
            return tbps
    own = row.get("peak_bw_gbps")
    return float(own) / 1000 if own is not None and not pd.isna(own) else math.nan


def with_peak(df: pd.DataFrame) -> pd.DataFrame:
    """Adds ``peak_tbps`` per row (NaN where the GPU is unknown or the row ran on a CPU)."""
    out = df.copy()
    out["peak_tbps"] = [peak_tbps(r) for _, r in out.iterrows()] if len(out) else []
    return out
