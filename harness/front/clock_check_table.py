"""The clock's error against the published set: per point, then the medians by metric, GPU and split.

The error of a point is signed, ``100 * (simulated - published) / published``: a latency the clock prices
too fast, or a throughput it prices too low, is negative. Each group reports its count, the median of the
absolute errors (the headline), and the median signed error (which way the clock leans).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from kvbench.harness.front.clock_check_points import Point
from kvbench.harness.front.clock_check_price import Priced
from kvbench.harness.measure.error_groups import Group, PointError, error_groups, gpu_label

RESULT_COLUMNS = ("id", "split", "engine", "gpu", "gpu_count", "model", "metric", "published", "simulated",
                  "error_pct", "abs_error_pct", "requests", "reason", "command")


@dataclass(frozen=True)
class Result:
    point: Point
    priced: Priced

    @property
    def error_pct(self) -> float | None:
        if self.priced.simulated is None:
            return None
        return signed_error_pct(self.priced.simulated, self.point.value)


def signed_error_pct(simulated: float, published: float) -> float:
    return 100.0 * (simulated - published) / published


def summarize(results: list[Result]) -> list[Group]:
    """Medians overall, per metric, per GPU (with its count: 2 x h100-sxm is its own line) and per split."""
    return error_groups(PointError(r.point.metric, gpu_label(r.point.gpu, r.point.gpu_count), r.point.split,
                                   r.error_pct) for r in results if r.error_pct is not None)


def write_csv(results: list[Result], path: Path) -> None:
    """One row per point: its figure, the clock's, the error, or why it was not priced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(RESULT_COLUMNS)
        for r in results:
            p, e = r.point, r.error_pct
            w.writerow([p.id, p.split, p.engine, p.gpu, p.gpu_count, p.model, p.metric, f"{p.value:g}",
                        "" if r.priced.simulated is None else f"{r.priced.simulated:.4g}",
                        "" if e is None else f"{e:.1f}", "" if e is None else f"{abs(e):.1f}",
                        r.priced.requests, r.priced.reason, r.priced.command])


def markdown(results: list[Result], header: str) -> str:
    """The error table, the unpriced points with their reasons, and every point's line."""
    lines = [header, "", "| group | points | median abs error | median signed error |", "| --- | ---: | ---: | ---: |"]
    for g in summarize(results):
        name = "**all**" if g.by == "all" else f"{g.by}: {g.key}"
        lines.append(f"| {name} | {g.count} | {g.median_abs_pct:.1f}% | {g.median_signed_pct:+.1f}% |")
    unpriced = [r for r in results if r.error_pct is None]
    lines += ["", f"Priced {len(results) - len(unpriced)} of {len(results)} points."]
    if unpriced:
        lines += ["", "Not priced:", ""] + [f"- `{r.point.id}`: {r.priced.reason}" for r in unpriced]
    lines += ["", "| point | split | GPU | metric | published | simulated | error |",
              "| --- | --- | --- | --- | ---: | ---: | ---: |"]
    for r in results:
        p, e = r.point, r.error_pct
        sim = "-" if r.priced.simulated is None else f"{r.priced.simulated:.4g}"
        err = "-" if e is None else f"{e:+.1f}%"
        lines.append(f"| {p.id} | {p.split} | {gpu_label(p.gpu, p.gpu_count)} | {p.metric} | {p.value:g} | {sim} | {err} |")
    return "\n".join(lines) + "\n"
