"""``python -m harness.report [DIRS...] [--out DIR]``: every run found, one table, the plots, REPORT.md.

Reads only the run folders' tables (rows, points) and Hydra's record of their overrides.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from matplotlib.figure import Figure

from harness.report.collect import Collection, collect
from harness.report.figures import impl_palette, save, theme
from harness.report.markdown import SECTIONS, render
from harness.report.memory_plots import kv_breakdown, max_concurrency, memory_vs_concurrency
from harness.report.speed_plots import decode_throughput, gpu_comparison, kernel_latency_bandwidth
from harness.results import write_table

__all__ = ["Report", "build_report", "regenerate_command"]


@dataclass
class Report:
    collection: Collection
    out: Path
    figures: dict[str, Figure] = field(default_factory=dict)  # closed, but still inspectable
    files: list[Path] = field(default_factory=list)


def regenerate_command(argv: list[str]) -> str:
    return " ".join(["python -m harness.report", *(shlex.quote(a) for a in argv)])


def build_report(dirs: list[Path], out: Path, command: str) -> Report:
    col = collect(dirs)
    if col.rows.empty:
        raise FileNotFoundError(f"no run folders (rows.parquet or rows.csv) under {', '.join(map(str, dirs))}")
    out.mkdir(parents=True, exist_ok=True)
    report = Report(col, out)
    write_table(col.rows, out / "all_runs")
    report.files += [out / "all_runs.parquet", out / "all_runs.csv"]
    if not col.points.empty:
        write_table(col.points, out / "all_points")
        report.files += [out / "all_points.parquet", out / "all_points.csv"]

    plots = out / "plots"
    for name, _ in SECTIONS:  # a figure whose data is gone must not linger from an earlier report
        for ext in ("png", "svg"):
            (plots / f"{name}.{ext}").unlink(missing_ok=True)
    palette = impl_palette(col.rows["impl"].dropna().astype(str).unique())
    notes: dict[str, list[str]] = {}
    with theme():
        fig, notes["memory_vs_concurrency"] = memory_vs_concurrency(col.points, col.rows)
        drawn = {
            "memory_vs_concurrency": fig,
            "kv_breakdown": kv_breakdown(col.rows),
            "max_concurrency": max_concurrency(col.rows),
            "decode_throughput": decode_throughput(col.rows, palette),
            "kernel_latency_bandwidth": kernel_latency_bandwidth(col.rows, palette),
            "gpu_comparison": gpu_comparison(col.rows, palette),
        }
        for name, fig in drawn.items():
            if fig is not None:
                report.files += save(fig, plots, name)
                report.figures[name] = fig
    (out / "REPORT.md").write_text(render(col, list(report.figures), command, notes))
    report.files.append(out / "REPORT.md")
    return report
