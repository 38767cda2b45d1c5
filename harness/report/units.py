"""Durations in the unit a person reads: a column of milliseconds becomes seconds or minutes by its size.

A service table under overload holds TTFTs like ``1.36e+06`` ms; the same column in minutes
(22.7) is read at a glance. One unit per column, so the rows of a column compare directly.
"""

from __future__ import annotations

import pandas as pd

# (unit, milliseconds per unit, the largest value shown in the unit below it)
_UNITS = (("min", 60_000.0, 600_000.0), ("s", 1_000.0, 10_000.0))


def duration_unit(values: pd.Series) -> tuple[str, float]:
    """The unit for a column of milliseconds and its size in ms: ``ms`` until its largest value passes
    10 s, ``s`` until it passes 10 min, then ``min``."""
    peak = pd.to_numeric(values, errors="coerce").abs().max()
    for unit, ms, above in _UNITS:
        if pd.notna(peak) and peak > above:
            return unit, ms
    return "ms", 1.0


def readable_durations(df: pd.DataFrame, headers: dict[str, str]) -> tuple[pd.DataFrame, dict[str, str]]:
    """``df`` with each millisecond column (its header ends in `` ms``) scaled to its readable unit,
    and the headers saying the unit; other columns as they are."""
    df, headers = df.copy(), dict(headers)
    for col, header in headers.items():
        if col in df and header.endswith(" ms"):
            unit, ms = duration_unit(df[col])
            if unit != "ms":
                df[col] = pd.to_numeric(df[col], errors="coerce") / ms
                headers[col] = f"{header[:-3]} {unit}"
    return df, headers
