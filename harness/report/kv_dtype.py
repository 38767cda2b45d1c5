"""The KV cache's data type side by side: what each dtype holds, how fast it decodes, and what it costs in accuracy.

Per model, device and impl, one line per ``kv_dtype`` (and scale granularity):

- capacity rows (full scale, no tensors): tokens per GB of KV memory and the analytic max concurrency;
- decode rows: decode and prefill step times (users report they move in opposite directions), and,
  at a quantized dtype, the accuracy against the same requests at ``kv_dtype=auto``: greedy and
  teacher-forced top-1 agreement, mean KL, the perplexity where the workload was a real text, and the
  gate's verdict. Rows on dummy weights say so: their agreement is how far rounding moves random logits.
"""

from __future__ import annotations

import pandas as pd

from kvbench.harness.report.selection import ok_rows
from kvbench.harness.report.tables import md_table, pick

KV_DTYPE_TITLE = "The KV cache's data type"
GB = 1e9


def _labelled(df: pd.DataFrame) -> pd.DataFrame:
    kv = df["kv_dtype"].fillna("auto").astype(str) if "kv_dtype" in df else pd.Series("auto", index=df.index)
    scale = df["kv_scale"] if "kv_scale" in df else pd.Series(None, index=df.index)
    label = [k if k == "auto" or pd.isna(s) else f"{k} ({'per tensor' if s == 'tensor' else 'per token x head'})"
             for k, s in zip(kv, scale)]
    return df.assign(kv=label, _auto=(kv == "auto"))


def _varies(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Only the settings measured at more than one kv_dtype: a table of one dtype compares nothing."""
    if df.empty:
        return df
    counts = df.groupby(keys, dropna=False)["kv"].transform("nunique")
    return df[counts > 1]


def capacity_table(rows: pd.DataFrame) -> pd.DataFrame:
    df = ok_rows(rows, "capacity")
    if df.empty or "kv_bytes_per_token" not in df:
        return pd.DataFrame()
    df = _labelled(df[df["kv_bytes_per_token"].notna()])
    df = df.assign(tokens_per_gb=(GB / df["kv_bytes_per_token"].astype(float)).round().astype("Int64"))
    keys = [k for k in ("device_slug", "model", "dtype", "impl") if k in df]
    df = _varies(df, keys)
    cols = [c for c in ("kv_bytes_per_token", "tokens_per_gb", "max_concurrency_analytic", "max_concurrency") if c in df]
    return df.groupby([*keys, "kv", "_auto"], dropna=False)[cols].first().reset_index() \
        .sort_values([*keys, "_auto"], ascending=[True] * len(keys) + [False])


def decode_table(rows: pd.DataFrame) -> pd.DataFrame:
    df = ok_rows(rows, "decode")
    if df.empty or "kv_dtype" not in df:
        return pd.DataFrame()
    if "request_rate" in df:
        df = df[df["request_rate"].isna()]  # a burst: the service tables hold runs under arrivals
    df = _labelled(df)
    keys = [k for k in ("device_slug", "model", "dtype", "workload", "batch", "impl") if k in df]
    df = _varies(df, keys)
    cols = [c for c in ("step_ms_p50", "prefill_step_ms_p50", "output_tokens_per_s", "kv_greedy_agreement",
                        "kv_top1_agreement", "kv_kl_mean", "kv_perplexity", "kv_ref_perplexity", "kv_accuracy_gate",
                        "kv_accuracy_weights") if c in df]
    return df.groupby([*keys, "kv", "_auto"], dropna=False)[cols].first().reset_index() \
        .sort_values([*keys, "_auto"], ascending=[True] * len(keys) + [False])


def _pct(v) -> str:
    return "–" if v is None or pd.isna(v) else f"{100 * v:.1f}%"


def kv_dtype_section(rows: pd.DataFrame) -> list[str]:
    cap, dec = capacity_table(rows), decode_table(rows)
    if cap.empty and dec.empty:
        return []
    parts = [f"## {KV_DTYPE_TITLE}\n",
             "Each setting at every `kv_dtype` it was measured at (`auto`: the model's dtype). A quantized store "
             "holds one byte an element, plus an fp32 scale per token and KV head at `kv_scale=token_head` "
             "(per tensor: one per layer, not counted per token).\n"]
    if not cap.empty:
        parts += ["Capacity at full scale (bookkeeping, no tensors):\n",
                  md_table(pick(cap, {"device_slug": "device", "model": "model", "dtype": "model dtype", "impl": "impl",
                                      "kv": "kv_dtype", "kv_bytes_per_token": "KV bytes/token",
                                      "tokens_per_gb": "tokens per GB",
                                      "max_concurrency_analytic": "max concurrency (analytic)"}))]
    if not dec.empty:
        shown = dec.assign(**{c: dec[c].map(_pct) for c in ("kv_greedy_agreement", "kv_top1_agreement") if c in dec})
        parts += ["Decode: step times, and the accuracy against the same requests at `kv_dtype=auto` (top-1 and KL "
                  "teacher-forced on the full-precision run's tokens, or on the text with `workload=text`; the gate: "
                  "top-1 agreement of at least 99%). Weights `dummy` are random: their agreement says how far "
                  "the data type moves random logits, not what a trained model loses.\n",
                  md_table(pick(shown, {"device_slug": "device", "model": "model", "workload": "workload",
                                        "batch": "batch", "impl": "impl", "kv": "kv_dtype",
                                        "step_ms_p50": "decode step p50 ms", "prefill_step_ms_p50": "prefill step p50 ms",
                                        "kv_greedy_agreement": "greedy agreement", "kv_top1_agreement": "top-1",
                                        "kv_kl_mean": "KL (nats)", "kv_perplexity": "perplexity",
                                        "kv_ref_perplexity": "perplexity at auto", "kv_accuracy_gate": "gate",
                                        "kv_accuracy_weights": "weights"}))]
    return parts
