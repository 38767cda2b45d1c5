"""``python -m harness.report [DIRS...] [--out DIR] [--max-spread F]``: every run found, one table, the plots, REPORT.md.

Reads the run folders' tables (rows, points, rate_probes, steps, tokens.jsonl for parity) and Hydra's record of
their overrides, and the result JSON files of other systems under ``external/<system>/`` (harness/report/external.py).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path, PurePath

from matplotlib.figure import Figure

from kvbench.harness.report.collect import Collection, collect

from kvbench.harness.report.external import ExternalDefaults
from kvbench.harness.report.figures import impl_palette, save_all, theme
from kvbench.harness.report.markdown import SECTIONS, render
from kvbench.harness.report.memory_plots import kv_breakdown, max_concurrency, memory_vs_concurrency, memory_vs_concurrency_more
from kvbench.harness.report.reuse_plots import hit_rate_vs_cache, ttft_vs_hit_rate
from kvbench.harness.report.stale import stale_reasons
from kvbench.harness.report.service_plots import goodput, kv_over_time, normalized_latency
from kvbench.harness.report.speed_plots import decode_throughput, gpu_comparison, kernel_latency_bandwidth
from kvbench.harness.report.variance import DEFAULT_MAX_SPREAD, check_max_spread
from kvbench.harness.results import atomic_write, write_table
from kvbench.harness.untrusted import own_subfolder

DEFAULT_FOLDER = "runs"  # what ``python -m harness.report`` reads without a folder: the user's own runs and sweeps
PUBLISHED_FOLDER = "results"  # make sweep's published sets; their report is results/REPORT.md

__all__ = ["NoRows", "Report", "build_report", "regenerate_command"]


class NoRows(FileNotFoundError):
    """No run folder had rows; ``collection`` still names the folders and tables that could not be read."""

    def __init__(self, message: str, collection: Collection):
        super().__init__(message)
        self.collection = collection


@dataclass
class Report:
    collection: Collection
    out: Path
    figures: dict[str, Figure] = field(default_factory=dict)  # closed, but still inspectable
    files: list[Path] = field(default_factory=list)


def regenerate_command(argv: list[str]) -> str:
    """The command REPORT.md gives to make it again, the same however the folders were spelt (``results/``,
    ``./results``; ``runs/`` or nothing for the default ``runs``), so regenerating the published report with the
    README's command or ``make report`` leaves REPORT.md as it was."""
    args = [a if a.startswith("-") else PurePath(a).as_posix() for a in argv]
    if args == [DEFAULT_FOLDER]:
        args = []
    return " ".join(["python -m harness.report", *(shlex.quote(a) for a in args)])


def build_report(dirs: list[Path], out: Path, command: str, max_spread: float = DEFAULT_MAX_SPREAD,
                 external: ExternalDefaults | None = None) -> Report:
    """Everything the run folders under ``dirs`` hold, into ``out``. A metric whose repeats spread
    more than ``max_spread`` ((max - min) / median) is marked in the tables, not quoted clean.
    ``external``: the device and batch of imported results that do not record them (harness/report/external.py).

    Rows measured while the machine was busy (``contended``) are drawn like the others, ringed and named in
    the legend, and marked in the tables; a figure that leaves a row out says which and why in REPORT.md."""
    max_spread = check_max_spread(max_spread)
    col = collect(dirs, external)
    if not col.rows.empty:  # why a row no longer describes this checkout (harness/report/stale.py), or empty
        col.rows["stale"] = stale_reasons(col.rows)
    if col.rows.empty:
        unread = (f" ({len(col.problems)} unreadable tables, {len(col.incomplete)} incomplete folders)"
                  if col.warnings() else "")
        raise NoRows(f"no run folders with rows (rows.parquet or rows.csv) under {', '.join(map(str, dirs))}{unread}",
                     col)
    out.mkdir(parents=True, exist_ok=True)
    report = Report(col, out)
    write_table(col.rows, out / "all_runs")
    report.files += [out / "all_runs.parquet", out / "all_runs.csv"]
    for name, table in (("all_points", col.points), ("all_rate_probes", col.rate_probes)):
        if not table.empty:
            write_table(table, out / name)
            report.files += [out / f"{name}.parquet", out / f"{name}.csv"]

    plots = own_subfolder(out, "plots")  # refused when a link: nothing is written where it points
    for name, _ in SECTIONS:  # a figure whose data is gone must not linger from an earlier report
        for ext in ("png", "svg"):
            (plots / f"{name}.{ext}").unlink(missing_ok=True)
    rows = col.rows
    palette = impl_palette(rows["impl"].dropna().astype(str).unique())
    notes: dict[str, list[str]] = {name: [] for name in ("decode_throughput", "normalized_latency", "goodput",
                                                         "kernel_latency_bandwidth", "reuse_hit_rate")}
    with theme():
        fig, left_out = memory_vs_concurrency(col.points, rows)
        more, left_over = memory_vs_concurrency_more(col.points, rows)
        # what the first figure leaves out the second draws, or names (without it, the first names them)
        notes["memory_vs_concurrency"] = left_out if more is None else []
        notes["memory_vs_concurrency_more"] = left_over if more is not None else []
        drawn = {
            "memory_vs_concurrency": fig,
            "memory_vs_concurrency_more": more,
            "kv_breakdown": kv_breakdown(rows),
            "max_concurrency": max_concurrency(rows),
            "decode_throughput": decode_throughput(rows, palette, notes["decode_throughput"]),
            "normalized_latency": normalized_latency(rows, palette, notes["normalized_latency"]),
            "goodput": goodput(rows, palette, notes["goodput"]),
            "kv_over_time": kv_over_time(col.steps, rows, palette),
            "kernel_latency_bandwidth": kernel_latency_bandwidth(rows, palette, notes["kernel_latency_bandwidth"]),
            "gpu_comparison": gpu_comparison(rows, palette),
            "reuse_hit_rate": hit_rate_vs_cache(rows, notes["reuse_hit_rate"]),
            "reuse_ttft": ttft_vs_hit_rate(rows),
        }
        report.figures.update((name, fig) for name, fig in drawn.items() if fig is not None)
        report.files += save_all(report.figures, plots)
    # a section whose every setting is one point: no figure, its rows the table
    tabled = [name for name, fig in drawn.items() if fig is None and notes.get(name)]
    text = render(col, list(report.figures), command, notes, max_spread, tabled)
    atomic_write(out / "REPORT.md", lambda tmp: tmp.write_text(text, encoding="utf-8"))
    report.files.append(out / "REPORT.md")
    return report
