"""A short human-readable summary of a job's rows on stdout (the files hold everything).

One table per job, its columns padded to one width (text left, numbers right) and one unit
per column, named in the header. The columns are the figures the job is about: a service run
(requests arriving over time: ``arrival`` poisson, gamma, constant or trace) shows latency
percentiles and, when an SLO was set, its verdict; a burst decode shows throughput and memory.
"""

from __future__ import annotations

import numbers
import sys
from pathlib import Path
from typing import Any, Sequence

SHOWN = {
    "decode": ["impl", "status", "wall_s", "output_tokens_per_s", "step_ms_p50", "ttft_ms_p99", "peak_concurrency",
               "preemptions", "kv_bytes_reserved", "kv_bytes_used", "output_digest"],
    "capacity": ["impl", "status", "max_concurrency", "max_concurrency_analytic", "kv_bytes_reserved",
                 "kv_bytes_used", "kv_used_fraction", "preemptions", "wall_s"],
    "max_concurrency": ["impl", "status", "max_concurrency", "max_concurrency_analytic", "probes"],
    "max_rate": ["impl", "status", "max_rate_rps", "probes", "normalized_latency_s", "ttft_ms_p99", "tpot_ms_p99"],
    # the profile's summary row, its rates simulated on it, and the max rate it found there
    "profile": ["impl", "status", "clock", "request_rate", "ttft_ms_p50", "tpot_ms_p50", "e2el_ms_p50", "e2el_ms_p99",
                "slo_pass", "max_rate_rps", "probes", "clock_source"],
    # layout: a paged impl's kernel is timed over its own table and an identity ("contiguous") one
    "kernel": ["impl", "layout", "status", "kernel_batch", "context_len", "block_size", "latency_us_p50",
               "bandwidth_gbps", "frac_copy_bw"],
}
# Requests arriving over time (decode on the wall clock, capacity on the simulated one): what the
# run is about is the service each request got, not the cache's size.
SERVICE = ["impl", "status", "arrival", "clock", "request_rate", "achieved_rps", "ttft_ms_p50", "ttft_ms_p99",
           "tpot_ms_p50", "tpot_ms_p99", "e2el_ms_p50", "e2el_ms_p99", "output_tokens_per_s", "preemptions"]
SLO_VERDICT = ["slo", "slo_pass", "slo_attainment", "goodput_rps"]  # only when the rows name an SLO
SERVICE_SCENARIOS = ("decode", "capacity")  # the scenarios whose rows may serve arrivals
ALWAYS = ("impl", "status")  # shown even when empty; another column empty in every row is left out
MS_TO_S = 1000.0  # a latency column whose largest value is this many ms or more is shown in seconds


def is_service(row: dict) -> bool:
    """A row whose requests arrived over time (``arrival`` not ``burst``), with latencies measured."""
    return (row.get("scenario") in SERVICE_SCENARIOS and row.get("arrival") not in (None, "burst")
            and _present(row.get("ttft_ms_p50")))


def _present(v: Any) -> bool:
    return v is not None and v == v  # NaN is not equal to itself


def _number(v: Any) -> bool:
    """A number to scale and right-align: numpy's too (np.int64 is no int), a flag is not (bool, np.bool_)."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and _present(v)


def _flag(v: Any) -> bool:
    """True/False, numpy's included (read without importing numpy: a job's summary may have none loaded)."""
    return isinstance(v, bool) or getattr(getattr(v, "dtype", None), "kind", None) == "b"


def columns(rows: Sequence[dict]) -> list[str]:
    """The columns of the summary of ``rows`` (the ok rows of one job)."""
    scenario = next((r.get("scenario") for r in rows if r.get("scenario")), "decode")
    if rows and all(is_service(r) for r in rows):
        cols = SERVICE + (SLO_VERDICT if any(_present(r.get("slo")) for r in rows) else [])
    else:
        cols = SHOWN.get(scenario, SHOWN["decode"])
    return [c for c in cols if c in ALWAYS or any(_present(r.get(c)) for r in rows)]


def _in_seconds(col: str, rows: Sequence[dict]) -> bool:
    """A millisecond column shown in seconds: its largest value is a second or more (e2el under load)."""
    values = [abs(v) for r in rows if _number(v := r.get(col))]
    return "_ms_" in col and bool(values) and max(values) >= MS_TO_S


def _header(col: str, seconds: bool) -> str:
    """One unit per column: bytes in GB (1e9 bytes), long latencies in s; the header says which."""
    if seconds:
        return col.replace("_ms_", "_s_")
    return col.replace("bytes", "GB") if "bytes" in col else col


def _fmt(col: str, v: Any, seconds: bool = False) -> str:
    if not _present(v):
        return "-"
    if _flag(v):  # slo_pass: yes/no, not True/1.0
        return "yes" if v else "no"
    if not _number(v):
        return str(v)
    if "bytes" in col:
        return f"{v / 1e9:.4g}"
    if seconds:
        return f"{v / MS_TO_S:.4g}"
    if isinstance(v, numbers.Integral):
        return str(int(v))
    return f"{v:.4g}"


def table(rows: Sequence[dict]) -> list[str]:
    """The summary's lines: a header, then one line per row, every column padded to its widest cell."""
    cols = columns(rows)
    seconds = {c: _in_seconds(c, rows) for c in cols}
    cells = [[_header(c, seconds[c]) for c in cols]] + [[_fmt(c, r.get(c), seconds[c]) for c in cols] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(cols))]
    # a column of numbers is right-aligned, its header too (the digits line up under it); words left
    numeric = [any(_number(r.get(c)) for r in rows) for c in cols]
    return ["  ".join(cell.rjust(w) if num else cell.ljust(w) for cell, w, num in zip(line, widths, numeric)).rstrip()
            for line in cells]


def print_summary(rows: list[dict], run_dir: Path) -> None:
    for row in rows:
        if row.get("status") not in (None, "ok") and row.get("error"):
            print(f"kvbench: {row.get('impl') or 'run'}: {row['status']}: {row['error']}", file=sys.stderr)
    ok = [r for r in rows if r.get("status") == "ok"]
    if ok:
        print("\n".join(table(ok)))
    print(f"results: {run_dir}")
