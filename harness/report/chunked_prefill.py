"""Chunked prefill against whole-prompt prefill: the same requests, scheduled both ways, side by side.

A whole-prompt prefill step stalls every running sequence for the prompt's forward; chunked prefill
(harness/serving/scheduler.py) shares each step's token budget between the decodes and prompt chunks.
Rows are paired by everything that makes them the same requests on the same setup but the two
scheduling keys (``chunked_prefill``, ``max_num_batched_tokens``); the section shows, per rate, the
latencies each way: the inter-token stall (ITL p99) is what chunking removes, TTFT what it may cost.
"""

from __future__ import annotations

import pandas as pd

from kvbench.harness.report.selection import measured_as
from kvbench.harness.report.tables import md_table, pick

CHUNKED_TITLE = "Chunked prefill against whole-prompt prefill"
SAME = ["device_slug", "scenario", "clock", "clock_source", "model", "dtype", "impl", "batch", "max_seq_len",
        "block_size", "workload_digest", "request_rate"]
FIGURES = ["ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99", "itl_ms_p99", "output_tokens_per_s"]


def chunked_pairs(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per setting served both ways: each figure whole (``_whole``) and chunked (``_chunked``)."""
    frames = [measured_as(rows, s) for s in ("decode", "capacity")]
    df = pd.concat([f for f in frames if not f.empty], ignore_index=True) if any(not f.empty for f in frames) \
        else pd.DataFrame()
    if df.empty or "chunked_prefill" not in df or "request_rate" not in df:
        return pd.DataFrame()
    df = df[df["request_rate"].notna() & df["chunked_prefill"].notna()]
    chunked = df["chunked_prefill"].astype(bool)
    keys = [k for k in SAME if k in df]
    cols = [f for f in FIGURES if f in df]
    whole = df[~chunked][keys + cols + ["max_num_batched_tokens"]]
    chunk = df[chunked][keys + cols + ["max_num_batched_tokens"]]
    both = whole.merge(chunk, on=keys, suffixes=("_whole", "_chunked"))
    order = [k for k in ("device_slug", "clock", "model", "impl", "request_rate") if k in both]
    return both.sort_values(order).reset_index(drop=True)


def _ms(v) -> str:
    return "–" if v is None or pd.isna(v) else f"{v:.1f}"


def chunked_section(rows: pd.DataFrame) -> list[str]:
    pairs = chunked_pairs(rows)
    if pairs.empty:
        return []
    shown = pairs.assign(**{c: pairs[c].map(_ms) for c in pairs if c.split("_")[0] in ("ttft", "tpot", "itl")})
    cols = {"device_slug": "device", "clock": "clock", "model": "model", "impl": "impl",
            "request_rate": "req/s", "max_num_batched_tokens_chunked": "budget"}
    for f, name in (("itl_ms_p99", "ITL p99 ms"), ("tpot_ms_p99", "TPOT p99 ms"), ("tpot_ms_p50", "TPOT p50 ms"),
                    ("ttft_ms_p50", "TTFT p50 ms"), ("ttft_ms_p99", "TTFT p99 ms")):
        cols[f"{f}_whole"] = f"{name} whole"
        cols[f"{f}_chunked"] = "chunked" + " " * len(cols)  # distinct headers, shown alike
    return [f"## {CHUNKED_TITLE}\n",
            "The same requests with whole-prompt prefill steps and with chunked prefill (`chunked_prefill=true`: "
            "every step's `max_num_batched_tokens` holds the decodes' tokens first, then prompt chunks, in one "
            "forward). A whole prompt's prefill stalls every running sequence (ITL p99); chunks share the step "
            "with the decodes, and a prompt may take several steps to its first token (TTFT).\n",
            md_table(pick(shown, cols))]
