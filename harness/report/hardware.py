"""Peak memory bandwidth by GPU, to put results from different GPUs on one scale.

The figures are conf/gpu/NAME.yaml's ``bandwidth_gbps`` (each with its datasheet source):
the one home of a GPU's peak. A row measured on a GPU is matched to the file whose
``match`` words all appear in its GPU name (or device slug); the file with the most
words wins, so ``h100 pcie`` takes an H100 PCIe before ``h100`` does.
"""

from __future__ import annotations

import math
import re
from functools import cache

import pandas as pd
from omegaconf import OmegaConf

from kvbench.harness.paths import CONF_DIR


@cache
def gpu_peaks() -> list[tuple[tuple[str, ...], float]]:
    """(match words, peak TB/s) of every conf/gpu/ file that has both, most specific first."""
    found = []
    for path in sorted((CONF_DIR / "gpu").glob("*.yaml")):
        spec = OmegaConf.load(path)
        words, gbps = tuple(str(w).lower() for w in spec.get("match") or ()), spec.get("bandwidth_gbps")
        if words and gbps:
            found.append((words, float(gbps) / 1000))
    return sorted(found, key=lambda entry: -len(entry[0]))


def _tokens(name: str) -> list[str]:
    """``NVIDIA H100 80GB HBM3`` -> [nvidia, h100, 80gb, hbm3] (the words of its device slug)."""
    return [t for t in re.split(r"[^a-z0-9]+", name.lower()) if t]


def table_peak_tbps(name: str | None) -> float:
    if not isinstance(name, str) or not name:
        return math.nan
    tokens = _tokens(name)
    for needles, tbps in gpu_peaks():
        if all(n in tokens for n in needles):
            return tbps
    return math.nan


def peak_tbps(row: pd.Series) -> float:
    """conf/gpu/'s figure for the row's GPU, else the row's own peak_bw_gbps, else NaN."""
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
