"""The simulated clock's error against published figures, as one table's lines: the medians overall, per metric,
per GPU and per split (``make clock-check``'s table, harness/front/clock_check_table.py, and the report's section on
it, harness/report/published_clock.py, both draw it here).

A point's error is signed, ``100 * (simulated - published) / published``; each line reports its count, the median of
the absolute errors (the headline) and the median signed error (which way the clock leans).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Iterable, NamedTuple


@dataclass(frozen=True)
class Group:
    """One line of the error table."""

    by: str  # "all", "metric", "gpu", "split"
    key: str
    count: int
    median_abs_pct: float
    median_signed_pct: float


class PointError(NamedTuple):
    """One priced point's keys and its signed error, percent."""

    metric: str
    gpu: str  # gpu_label's
    split: str
    error_pct: float


def gpu_label(gpu: str, count: int) -> str:
    """A GPU with its count: 2 x h100-sxm is its own line."""
    return gpu if count == 1 else f"{count} x {gpu}"


def group(by: str, key: str, errors: list[float]) -> Group:
    return Group(by, key, len(errors), statistics.median(abs(e) for e in errors), statistics.median(errors))


def error_groups(points: Iterable[PointError]) -> list[Group]:
    """Medians overall, per metric, per GPU and per split; no points, no lines."""
    points = list(points)
    if not points:
        return []
    lines = [group("all", "all", [p.error_pct for p in points])]
    for by in ("metric", "gpu", "split"):
        for key in sorted({getattr(p, by) for p in points}):
            lines.append(group(by, key, [p.error_pct for p in points if getattr(p, by) == key]))
    return lines
