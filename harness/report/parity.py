"""Output parity across impls: the same requests must give the same greedy tokens whatever the cache.

In fp32 the check is exact (one output digest). In bf16/fp16 two logits can tie after rounding and
kernels that sum in another order then pick different tokens, so the check there is the prefix
agreement of harness/report/agreement.py.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from kvbench.harness.report.agreement import EXACT_DTYPES, prefix_agreement, read_tokens
from kvbench.harness.report.selection import ok_rows, with_mode
from kvbench.harness.report.tables import md_table, pick

PARITY_TITLE = "Output parity across impls"


def parity_table(rows: pd.DataFrame, folders: dict[str, Path] | None = None) -> pd.DataFrame:
    """Greedy output parity: per device, model, dtype and workload, the digests each impl produced.

    In fp32 the check is exact (``agree``: one digest). In bf16/fp16, where tied logits may round
    apart, it is the prefix agreement of each impl's tokens with the reference impl's (contiguous,
    else the first), read from the run folders in ``folders`` (harness/report/agreement.py)."""
    if "output_digest" not in rows:
        return pd.DataFrame()
    df = with_mode(ok_rows(rows, "decode").dropna(subset=["output_digest"]))
    # Eager and graphed runs are compared separately: a padded batch may round bf16 differently.
    keys = ["device_slug", "model", "dtype", "workload", "workload_digest", "batch", "mode"]
    out = []
    for key, group in df.groupby(keys, dropna=False, sort=True):
        by_impl = group.groupby("impl")["output_digest"].agg(lambda d: ",".join(sorted(set(d))))
        if len(by_impl) < 2:
            continue
        rec = {**dict(zip(keys, key)), "impls": " ".join(by_impl.index),
               "digests": " ".join(sorted(set(by_impl))), "agree": by_impl.nunique() == 1}
        exact = str(rec["dtype"]) in EXACT_DTYPES
        rec["check"] = "exact" if exact else "prefix agreement"
        if exact or rec["agree"]:
            rec["result"] = "same tokens" if rec["agree"] else "DIFFERENT tokens"
        else:
            rec["result"] = _agreement_text(group, folders or {})
        out.append(rec)
    return pd.DataFrame(out)


def _agreement_text(group: pd.DataFrame, folders: dict[str, Path]) -> str:
    """Each impl's share of the reference impl's tokens it matched up to the first divergence."""
    impls = sorted(group["impl"].unique())
    reference = "contiguous" if "contiguous" in impls else impls[0]

    def tokens(impl: str):
        for run_dir in sorted(group.loc[group["impl"] == impl, "run_dir"].unique()):
            if run_dir in folders and (found := read_tokens(folders[run_dir], impl)) is not None:
                return found
        return None

    ref = tokens(reference)
    if ref is None:
        return "digests differ; no tokens.jsonl to compare"
    shares = []
    for impl in (i for i in impls if i != reference):
        other = tokens(impl)
        share = prefix_agreement(ref, other) if other is not None else None
        shares.append(f"{impl} {'–' if share is None else f'{100 * share:.1f}%'}")
    return f"vs {reference}: " + ", ".join(shares)


def parity_section(rows: pd.DataFrame, folders: dict[str, Path]) -> list[str]:
    parity = parity_table(rows, folders)
    if not len(parity):
        return []
    return [f"## {PARITY_TITLE}\n",
            "In fp32 the same requests must give the same greedy tokens whatever the cache and kernel: "
            "the check is exact. In bf16/fp16 two logits can tie after rounding and kernels that sum in "
            "another order then pick different tokens, so the check there is the prefix agreement: per "
            "request, the tokens equal up to its first divergence, over the reference impl's tokens.\n",
            md_table(pick(parity, {"device_slug": "device", "model": "model", "dtype": "dtype",
                                   "workload": "workload", "batch": "batch", "mode": "mode",
                                   "impls": "impls", "check": "check", "result": "result",
                                   "digests": "output digests"}))]
