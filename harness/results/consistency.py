"""Range and consistency checks of an imported result's figures, over kvbench's own row columns.

A file another system wrote (vLLM's ``--save-result`` JSON, AIPerf's profile export; read by
harness/results/vllm_json.py and harness/report/external.py) is data, and a figure in it can be
impossible (a negative duration, a NaN) or contradict another figure of the same file (a p99 below
its median, goodput above the request throughput). Read as they are, such figures would be drawn
beside kvbench's own as if measured. ``judged`` makes that row ``status=error`` instead, every
reason in ``error`` as one clause naming the file's key(s), the value(s) and what they must be:
the report lists it under "Rows not ok" and leaves it out of every plot.

Only what every file must satisfy by definition is checked. What the row cannot know is not:
a mean within [min, max] (the row keeps no min or max), or a mean beside its percentiles (a
skewed distribution puts the mean above p90).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Mapping

from kvbench.harness.results import is_count

# A latency summary: <family>_ms_<stat> (ttft, tpot, itl, e2el, queue, and any family added later).
LATENCY = re.compile(r"^(?P<family>[a-z0-9_]+?)_ms_(?P<stat>mean|p(?P<q>\d+(?:\.\d+)?))$")
# Two ordered figures can be equal in truth: p50 = p99 when every request took as long, goodput = request
# throughput when every request met the SLO. A writer that derives the two along different arithmetic
# (another order of a sum, a rate from a converted duration) can leave the lower one a last-digit step
# above. 1e-6 of the figure absorbs that, and nothing a run gets wrong.
ORDER_REL = 1e-6
# vLLM divides by the very duration it writes, so its file agrees to the last digit; 0.1% more leaves
# room for a writer whose divisor and written duration are two clock reads, and still catches a rate
# from another count, duration or unit. Figures written rounded get half their last digit on top.
RATE_REL = 1e-3
# The row's rates that vLLM defines over ``duration``: rate column -> the count columns it divides.
VLLM_RATES: dict[str, tuple[str, ...]] = {
    "achieved_rps": ("completed",),  # request_throughput = completed / duration
    "output_tokens_per_s": ("output_tokens",),  # output_throughput = total_output_tokens / duration
    "tokens_per_s": ("prompt_tokens", "output_tokens"),  # total_token_throughput = (input + output) / duration
}


def kind(column: str) -> str | None:
    """``time``, ``rate`` or ``count`` for a column whose values are never negative; None for any other."""
    if column.endswith(("_per_s", "_rps")) or column == "request_rate":
        return "rate"
    if LATENCY.match(column) or column.endswith("_s"):  # *_ms_<stat>, duration_s, wall_s, normalized_latency_s
        return "time"
    if is_count(column) or column == "completed":
        return "count"
    return None


def _figure(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _show(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _range_clause(key: str, v, k: str | None) -> str | None:
    """Why ``v`` (the file's ``key``, a figure of kind ``k``) is no figure a run gives, or None."""
    if not _figure(v):
        return None
    if not math.isfinite(v):
        return f"{key} = {v}: allowed a finite number"
    if v < 0 and k is not None:
        return f"{key} = {_show(v)}: a {k}, allowed >= 0"
    return None


def check_ranges(figures: Mapping, names: Mapping[str, str]) -> list[str]:
    """A clause per figure no run can give: not finite, or a negative time, rate or count."""
    clauses = (_range_clause(names.get(col, col), v, kind(col)) for col, v in figures.items())
    return [c for c in clauses if c is not None]


def check_each(key: str, values: list | None, k: str) -> list[str]:
    """The clause of the first value of a per-request list (one a row figure is derived from) that no request
    can have; the first only, so a list of bad values does not crowd the rest of the row's ``error`` out."""
    clauses = (_range_clause(f"{key}[{i}]", v, k) for i, v in enumerate(values or []))
    return [c for c in clauses if c is not None][:1]


def _finite(v) -> bool:
    return _figure(v) and math.isfinite(v)


def check_order(row: Mapping, names: Mapping[str, str]) -> list[str]:
    """A clause per pair of figures that contradict each other: a family's percentiles falling as the
    quantile rises, or goodput (the requests that met every SLO, per second) above the request throughput."""
    out = []
    families: dict[str, list[tuple[float, str]]] = {}
    for col in row:
        if (m := LATENCY.match(col)) and m["q"] is not None and _finite(row[col]):
            families.setdefault(m["family"], []).append((float(m["q"]), col))
    for cols in families.values():
        ranked = [c for _, c in sorted(cols)]
        for low, high in zip(ranked, ranked[1:]):  # neighbours present: p50 <= p99 where a file has no p90
            if row[high] < row[low] - ORDER_REL * abs(row[low]):
                hk, lk = names.get(high, high), names.get(low, low)
                out.append(f"{hk} = {_show(row[high])} < {lk} = {_show(row[low])}: "
                           f"a higher percentile, allowed >= {lk}")
    good, rps = row.get("goodput_rps"), row.get("achieved_rps")
    if _finite(good) and _finite(rps) and good > rps + ORDER_REL * abs(rps):
        gk, rk = names.get("goodput_rps", "goodput_rps"), names.get("achieved_rps", "achieved_rps")
        out.append(f"{gk} = {_show(good)} > {rk} = {_show(rps)}: goodput counts completed requests, allowed <= {rk}")
    return out


def check_consistency(row: Mapping, names: Mapping[str, str] | None = None) -> list[str]:
    """Every clause against an imported row (kvbench's columns, after mapping), impossible values first;
    ``names``: column -> the file's key it came from, so a clause names what the file says."""
    names = names or {}
    return list(dict.fromkeys(check_ranges(row, names) + check_order(row, names)))  # wall_s repeats duration_s


def _written_half_digit(v: float | int) -> float:
    """Half a unit in the last decimal place ``v`` is written with (0.21 -> 0.005): how far a figure
    written rounded (as printed for a person) may be from the one it stands for; an integer, half of 1."""
    return 0.5 * 10.0 ** Decimal(repr(v)).as_tuple().exponent


def check_rates(row: Mapping, completed, names: Mapping[str, str] | None = None,
                rates: Mapping[str, tuple[str, ...]] = VLLM_RATES) -> list[str]:
    """A clause per throughput that is not its counts over ``duration_s``, as vLLM defines each one
    (vllm/benchmarks/serve.py: ``completed / dur_s``, ``sum(output_lens) / dur_s``, ...), and for a
    ``completed`` count (a figure the row has no column for) outside its range.

    Not for AIPerf's export: its output token throughput divides a token count it does not export in
    every version (``benchmark_token_count``, not ``total_osl``), and what its ``request_count`` counts
    has changed between versions, so neither is a definition the file itself lets one check."""
    names = names or {}
    figures = {**row, "completed": completed}
    out = check_ranges({"completed": completed}, names)
    duration = figures.get("duration_s")
    if not _finite(duration) or duration <= 0:
        return out
    for rate_col, count_cols in rates.items():
        rate, counts = figures.get(rate_col), [figures.get(c) for c in count_cols]
        if not _finite(rate) or not all(_finite(c) and c >= 0 for c in counts):
            continue
        expected = sum(counts) / duration
        # what the written duration and rate may each be off by when written rounded, and float noise
        slack = expected * (RATE_REL + _written_half_digit(duration) / duration) + _written_half_digit(rate)
        if abs(rate - expected) > slack:
            over = " + ".join(names.get(c, c) for c in count_cols)
            out.append(f"{names.get(rate_col, rate_col)} = {_show(rate)}, but ({over}) / "
                       f"{names.get('duration_s', 'duration_s')} = {expected:.6g}: allowed within {RATE_REL:.1%} of it")
    return out


def judged(row: dict, reasons: list[str]) -> dict:
    """``row`` as it reads with ``reasons`` against it: unchanged without any, else ``status=error``
    with every reason (after an error the row had) in ``error``. A non-finite figure is emptied: in a
    table NaN reads as "not measured", and the reason keeps what the file said."""
    if not reasons:
        return row
    out = {k: (None if _figure(v) and not math.isfinite(v) else v) for k, v in row.items()}
    out["status"] = "error"
    out["error"] = "; ".join([*([row["error"]] if row.get("error") else []), *dict.fromkeys(reasons)])
    return out
