"""Repeats that disagree: a metric whose spread over a run's repeats exceeds a bound is marked, not quoted clean.

A row's ``<metric>_spread`` is (max - min) / median over its repeats (harness.measure.metrics.median_and_spread).
"""

from __future__ import annotations

import math

import pandas as pd

DEFAULT_MAX_SPREAD = 0.05  # 5%: beyond it the median of a run's repeats is too noisy to quote as one number
MARK = "†"
# The columns each spread covers besides its own metric: they come from the same timed repeats.
COVERS = {"tokens_per_s_spread": ("tokens_per_s", "output_tokens_per_s", "requests_per_s", "wall_s")}


def parse_fraction(text: str) -> float:
    """A command line's fraction, written as one (``0.05``) or as a percentage (``5%``); ValueError otherwise."""
    return float(text[:-1]) / 100 if text.endswith("%") else float(text)


def check_max_spread(value: float) -> float:
    """The bound as a fraction (0.05 = 5%); it must be a finite number at least 0."""
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"max_spread must be a finite fraction >= 0 (0.05 = 5%), got {value!r}")
    return float(value)


def covered(df: pd.DataFrame) -> dict[str, tuple[str, ...]]:
    """Each spread column present, with the metric columns it speaks for."""
    out = {}
    for col in df.columns:
        if isinstance(col, str) and col.endswith("_spread"):
            out[col] = tuple(dict.fromkeys((col.removesuffix("_spread"), *COVERS.get(col, ()))))
    return out


def mark_spread(df: pd.DataFrame, shown: list[str], max_spread: float, cell) -> tuple[pd.DataFrame, int]:
    """``df[shown]`` with every shown metric whose spread exceeds the bound written as ``<value> †``.

    ``cell`` formats a value as the markdown tables do, so a marked number reads like the rest.
    Returns the frame and how many rows have a mark."""
    out = df[shown].copy()
    marked = pd.Series(False, index=df.index)
    for spread_col, metrics in covered(df).items():
        cols = [c for c in (spread_col, *metrics) if c in shown]
        over = pd.to_numeric(df[spread_col], errors="coerce").fillna(0) > max_spread
        if not cols or not over.any():
            continue
        marked |= over
        for col in cols:
            out[col] = out[col].astype(object)
            out.loc[over, col] = [f"{cell(v)} {MARK}" for v in df.loc[over, col]]
    return out, int(marked.sum())


def footnote(max_spread: float, count: int) -> str:
    """The line under a table with marked cells (empty when none is marked)."""
    if not count:
        return ""
    return (f"{MARK} {count} row{'s' if count != 1 else ''}: the repeats of the run differ by more than "
            f"{100 * max_spread:g}% ((max - min) / median); the number is their median, not a stable result.\n")
