"""Markdown tables for REPORT.md: one cell's text, a table, and the columns a section shows."""

from __future__ import annotations

import math

import pandas as pd


def cell(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA or v is pd.NaT:
        return "–"
    if isinstance(v, float):
        return f"{v:.0f}" if v.is_integer() and abs(v) < 1e15 else f"{v:.4g}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def md_table(df: pd.DataFrame) -> str:
    """A GitHub markdown table (pandas' to_markdown needs tabulate, which is not a dependency)."""
    if df.empty:
        return "_(none)_\n"
    head = "| " + " | ".join(cell(c) for c in df.columns) + " |"
    rule = "| " + " | ".join("---" for _ in df.columns) + " |"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, rule, *body]) + "\n"


def pick(df: pd.DataFrame, cols: dict[str, str]) -> pd.DataFrame:
    """The columns present, renamed for display."""
    return df[[c for c in cols if c in df.columns]].rename(columns=cols)
