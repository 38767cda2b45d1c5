"""REPORT.md's sections on rows to weigh with care: folders not fully read, stale rows, rows measured while
the machine was busy (drawn, ringed, and marked in the tables: never dropped)."""

from __future__ import annotations

import pandas as pd

from kvbench.harness.report.collect import Collection
from kvbench.harness.report.page_one import FLAG
from kvbench.harness.report.palette import FLAGGED_LABEL
from kvbench.harness.report.selection import contended_rows
from kvbench.harness.report.tables import cell, md_code, md_table, pick


def mark_flagged(table: pd.DataFrame) -> pd.DataFrame:
    """The table with each flagged row's impl marked (``FLAG``), as the figures ring its point."""
    if "impl" not in table or "contended" not in table:
        return table
    busy = contended_rows(table)
    return table.assign(impl=[f"{i}{FLAG}" if b else i for i, b in zip(table["impl"], busy)])


def unread_section(col: Collection) -> list[str]:
    """What the report could not use: incomplete run folders and unreadable tables (nothing when all was read)."""
    parts = []
    if col.incomplete:
        parts += ["Incomplete run folders (a config.yaml or an empty rows table, but no rows: the job stopped, "
                  "or is still running, before its first row):\n",
                  "\n".join(f"- {md_code(label)}" for label, _ in col.incomplete) + "\n"]
    if col.problems:
        parts += ["Unreadable tables, and rows not read (no identifiers, or an unknown status):\n",
                  "\n".join(f"- {md_code(p.label)}: " + (f"{p.rows_left_out} rows not read ({cell(p.reason)})"
                                                       if p.rows_left_out else f"{cell(p.reason)}; ")
                            + ("" if p.rows_left_out else (f"read {md_code(p.used)} instead" if p.used else "left out"))
                            for p in col.problems) + "\n"]
    return ["## Run folders not fully read\n", *parts] if parts else []


def contended_section(rows: pd.DataFrame) -> list[str]:
    flagged = rows[contended_rows(rows)]
    if not len(flagged):
        return []
    return ["## Rows measured under contention\n",
            f"{len(flagged)} rows were measured while the process's threads waited for a free core more than 25% of "
            f"the time, other work and its threads together asked for more than 1.25x the machine's cores, or steal "
            f"took more than 5% of the machine: their times say more about the machine's other work "
            f"than about the cache. They are drawn like the others, each point ringed and named "
            f"\"{FLAGGED_LABEL}\" in the legend, and marked{FLAG} after the impl in the tables "
            f"(`contended`, `cpu_util` in `all_runs`).\n",
            md_table(pick(flagged, {"run_dir": "run", "scenario": "scenario", "impl": "impl", "batch": "batch",
                                     "cpu_util": "CPU used (cores)", "run_queue_wait_frac": "waited for a core",
                                     "others_cpu": "others' CPU (cores)", "load_avg_before": "load before",
                                     "load_avg_after": "load after"}))]


def stale_section(rows: pd.DataFrame) -> list[str]:
    if "stale" not in rows or not rows["stale"].notna().any():
        return []
    flagged = rows[rows["stale"].notna()]
    groups = (flagged.groupby(["device_slug", "stale"], dropna=False)["run_dir"].nunique()
              .reset_index().rename(columns={"run_dir": "run folders"}))
    return ["## Stale rows\n",
            f"{len(flagged)} rows no longer describe this checkout: older code measured them, or they are filed "
            "under another machine's folder. They stay in every table and figure, with the reason in the "
            "`stale` column of `all_runs`; re-run their commands to bring them up to date.\n",
            md_table(pick(groups, {"device_slug": "device", "stale": "why", "run folders": "run folders"}))]
