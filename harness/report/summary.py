"""The answer first: per device and model, what paging buys, each figure with its section and its command.

REPORT.md's sections hold the whole evidence; a reader who asks "what does paging buy here?"
should not have to assemble it from four of them. Three facts, when the runs hold them:

- memory: the KV memory paging saves at the seeds' experiment (100 concurrent requests), or at
  the most concurrent requests a model's accounting was run at, from the capacity points;
- max concurrency: the best paged impl's measured maximum over contiguous's, at one budget, where the budget
  (not ``batch``) stopped contiguous (page one says where ``batch`` bound it instead);
- max rate: the best paged impl's largest rate within the SLO over contiguous's.

A paged impl is one whose name starts with ``paged``; the Orca baselines are reservation
schemes, not paging, and are left to their sections.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from kvbench.harness.report.collect import Collection

from kvbench.harness.report.selection import ANY_DEVICE, measured_as, ok_rows
from kvbench.harness.report.figures import GB

SEEDS_WORKLOAD = "seeds"  # the seeds' own experiment: Llama-2-7B, 100 users


@dataclass(frozen=True)
class Headline:
    device: str  # the machine measured, the GPU simulated, or "any" for the KV accounting
    model: str
    fact: str  # "KV memory saved", "max concurrency", "max rate within the SLO"
    value: str  # the figure, e.g. "80.5 GB" or "1.75×"
    detail: str  # what it compares, in words
    section: str  # the report section's name (harness/report/markdown.py SECTIONS) it is drawn in
    run_dir: str | None  # a run folder whose command produced it


def is_paged(impl: str) -> bool:
    return str(impl).startswith("paged")


def memory_headlines(col: Collection, points_table: pd.DataFrame) -> list[Headline]:
    """Per model: paging's saving at the seeds' workload, else at the setting with the most requests."""
    if points_table.empty or "saved by paging GB" not in points_table:
        return []
    out = []
    for model, sub in points_table.groupby("model", sort=True):
        seeds = sub[sub["workload"] == SEEDS_WORKLOAD]
        pick = (seeds if len(seeds) else sub).sort_values(["requests", "saved by paging GB"]).iloc[-1]
        src = col.points[(col.points["model"] == model) & (col.points["workload"] == pick["workload"])]
        out.append(Headline(
            ANY_DEVICE, str(model), "KV memory saved", f"{pick['saved by paging GB']:.1f} GB",
            f"{pick['contiguous GB']:.1f} GB contiguous → {pick['paged GB']:.1f} GB paged at "
            f"{int(pick['requests'])} concurrent requests ({pick['workload']} workload, block {int(pick['block_size'])})",
            "memory_vs_concurrency", _first(src, col)))
    return out


def concurrency_headlines(col: Collection, table: pd.DataFrame) -> list[Headline]:
    """Per device and model: the best paged impl's measured max concurrency over contiguous's, at one setting."""
    if table.empty:
        return []
    out = []
    keys = [c for c in ("scenario", "model", "workload", "max_seq_len", "budget_kv_bytes", "device_slug") if c in table]
    for key, sub in table.groupby(keys, dropna=False, sort=True):
        setting = dict(zip(keys, key))
        base = sub[sub["impl"] == "contiguous"]
        paged = sub[sub["impl"].map(is_paged)].dropna(subset=["max_concurrency"])
        if base.empty or paged.empty or not base["max_concurrency"].iloc[0] > 0:
            continue
        best = paged.sort_values("max_concurrency").iloc[-1]
        n0, n1 = base["max_concurrency"].iloc[0], best["max_concurrency"]
        if bool(base["capped"].iloc[0]) if "capped" in base else False:
            # contiguous stopped at its batch limit, not at the budget: its count is no maximum, and no ratio
            # to it says what paging buys (a "≥ 1.00×" would read as "nothing")
            continue
        bound = "≥ " if bool(best.get("capped", False)) else ""  # the search stopped at its batch limit
        src = ok_rows(col.rows, setting["scenario"])
        src = src[(src["model"] == setting["model"]) & (src["device_slug"] == setting["device_slug"])]
        out.append(Headline(
            str(setting["device_slug"]), str(setting["model"]), "max concurrency", f"{bound}{n1 / n0:.2f}×",
            f"{best['impl']} {n1:.0f} vs contiguous {n0:.0f} concurrent requests in a "
            f"{_size(setting.get('budget_kv_bytes'))} KV budget ({setting.get('workload')} workload)",
            "max_concurrency", _first(src, col)))
    return out


def rate_headlines(col: Collection, table: pd.DataFrame) -> list[Headline]:
    """Per device (or simulated GPU) and model: the best paged impl's max rate within the SLO over contiguous's."""
    if table.empty or "ratio" not in table:
        return []
    out = []
    paged = table[table["impl"].map(is_paged)].dropna(subset=["ratio"])
    for _, best in paged.sort_values("ratio").groupby(
            [c for c in ("device_slug", "gpu", "model", "workload", "slo") if c in paged], dropna=False).tail(1).iterrows():
        simulated = isinstance(best.get("gpu"), str) and best.get("clock") == "simulated"
        device = f"simulated {best['gpu']}" if simulated else str(best["device_slug"])
        src = measured_as(col.rows, "max_rate")
        src = src[(src["model"] == best["model"]) & (src["workload"] == best["workload"])
                  & (src["device_slug"] == best["device_slug"])]
        if simulated and "gpu" in src:
            src = src[src["gpu"] == best["gpu"]]
        if "measured_at" in src:  # the newest run first: the one unique() keeps when two folders agree
            src = src.sort_values("measured_at", ascending=False, kind="stable")
        out.append(Headline(
            device, str(best["model"]), "max rate within the SLO", f"{best['ratio']:.2f}×",
            f"{best['impl']} {best['max_rate_rps']:.3g} vs contiguous {best['contiguous_rps']:.3g} req/s "
            f"({best['workload']} workload, SLO {best['slo']}, {'simulated' if simulated else 'wall'} clock)",
            "max_rate", _first(src, col)))
    return unique(sorted(out, key=lambda h: (h.device, h.model, h.detail, -_newest(col, h.run_dir))))


def _newest(col: Collection, run_dir: str | None) -> float:
    """When a run folder's rows were measured (epoch seconds; 0 when unknown)."""
    if run_dir is None or "measured_at" not in col.rows:
        return 0.0
    at = pd.to_datetime(col.rows.loc[col.rows["run_dir"] == run_dir, "measured_at"], errors="coerce", utc=True).max()
    return 0.0 if pd.isna(at) else at.timestamp()


def unique(headlines: list[Headline]) -> list[Headline]:
    """One headline per figure: a simulated GPU's figure computed on two machines (each one's folder
    holds the simulated sweeps) is the same figure, said once, from the first folder."""
    seen: set[tuple[str, ...]] = set()
    out = []
    for h in headlines:
        key = (h.device, h.model, h.fact, h.value, h.detail)
        if key not in seen:
            seen.add(key)
            out.append(h)
    return out


def _size(n) -> str:
    """Bytes in the unit that reads: GB, MB or kB (decimal, as the report's tables)."""
    if n is None or pd.isna(n):
        return "unknown"
    for unit, size in (("GB", GB), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def _first(rows: pd.DataFrame, col: Collection) -> str | None:
    """The run folder a headline cites: the first of ``rows``' that this checkout's code measured, else the first.
    The KV accounting is every machine's: two machines' folders give the same figure, and the other machine's,
    measured by older code, would mark a fresh figure stale."""
    if rows.empty or "run_dir" not in rows:
        return None
    dirs = sorted(rows["run_dir"].dropna().unique())
    if "stale" in col.rows:
        stale = set(col.rows.loc[col.rows["stale"].notna(), "run_dir"])
        dirs = [d for d in dirs if d not in stale] or dirs
    return str(dirs[0]) if dirs else None
