"""Attention's share of a step: how much of the model's step time is the cache's, from the profile rows.

A KV-cache benchmark measures the cache inside a step, and the rest of the step (projections, MLP,
norms, logits) sets how much the cache matters. ``scenario=profile`` times each layer's attention
(the cache's K/V write and its kernel) apart from the step it sits in
(harness/measure/attention_timer.py); its row carries the median share over the decode points and
the prefill points, and the share at the largest batch x context it profiled.
"""

from __future__ import annotations

import pandas as pd

from kvbench.harness.report.selection import ok_rows
from kvbench.harness.report.tables import md_table, pick

ATTENTION_TITLE = "Attention's share of a step"
SHARES = ("attention_share_decode", "attention_share_decode_top", "attention_share_prefill")


def attention_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per profile job's impl that timed its attention."""
    df = ok_rows(rows, "profile")
    if df.empty or not set(SHARES) <= set(df):
        return pd.DataFrame()
    df = df[df["attention_share_decode"].notna()]
    keys = [k for k in ("device_slug", "model", "dtype", "impl", "cpu_threads", "run_dir") if k in df]
    return df.sort_values(keys)[keys + list(SHARES)].reset_index(drop=True)


def _pct(v) -> str:
    return "–" if v is None or pd.isna(v) else f"{100 * v:.0f}%"


def attention_section(rows: pd.DataFrame) -> list[str]:
    table = attention_table(rows)
    if table.empty:
        return []
    shown = table.assign(**{c: table[c].map(_pct) for c in SHARES})
    return [f"## {ATTENTION_TITLE}\n",
            "The part of a step each impl's cache spends attending (its K/V writes and kernel), timed inside "
            "the real steps of `scenario=profile`; the rest is the model's dense work. Decode: the median "
            "over the profiled batch x context points, and the share at the largest of them.\n",
            md_table(pick(shown, {"device_slug": "device", "model": "model", "dtype": "dtype", "impl": "impl",
                                  "cpu_threads": "threads", "attention_share_decode": "decode (median)",
                                  "attention_share_decode_top": "decode (largest point)",
                                  "attention_share_prefill": "prefill (median)"}))]
