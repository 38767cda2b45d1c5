"""A short human-readable summary of a job's rows on stdout (the files hold everything)."""

from __future__ import annotations

import sys
from pathlib import Path

SHOWN = {
    "decode": ["impl", "status", "wall_s", "output_tokens_per_s", "step_ms_p50", "ttft_ms_p99", "peak_concurrency",
               "preemptions", "kv_bytes_reserved", "kv_bytes_used", "output_digest"],
    "capacity": ["impl", "status", "max_concurrency", "max_concurrency_analytic", "kv_bytes_reserved",
                 "kv_bytes_used", "kv_used_fraction", "preemptions", "wall_s"],
    "max_concurrency": ["impl", "status", "max_concurrency", "max_concurrency_analytic", "probes"],
    "max_rate": ["impl", "status", "max_rate_rps", "probes", "normalized_latency_s", "ttft_ms_p99", "tpot_ms_p99"],
    "kernel": ["impl", "status", "kernel_batch", "context_len", "block_size", "latency_us_p50",
               "bandwidth_gbps", "frac_copy_bw"],
}


def _header(col: str) -> str:
    """One unit per column: byte counts are shown in GB (1e9 bytes), and the header says so."""
    return col.replace("bytes", "GB") if "bytes" in col else col


def _fmt(col: str, v) -> str:
    if v is None or v != v:  # None or NaN
        return "-"
    if "bytes" in col and isinstance(v, (int, float)):
        return f"{v / 1e9:.4g}"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def print_summary(rows: list[dict], run_dir: Path) -> None:
    for row in rows:
        if row.get("status") not in (None, "ok") and row.get("error"):
            print(f"kvbench: {row.get('impl') or 'run'}: {row['status']}: {row['error']}", file=sys.stderr)
    scenario = next((r.get("scenario") for r in rows if r.get("scenario")), "decode")
    cols = SHOWN.get(scenario, SHOWN["decode"])
    ok = [r for r in rows if r.get("status") == "ok"]
    if ok:
        print("  ".join(_header(c) for c in cols))
        for r in ok:
            print("  ".join(_fmt(c, r.get(c)) for c in cols))
    print(f"results: {run_dir}")
