"""What each job of a sweep came to, and the sweep's one summary line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

SHOWN_FAILURES = 5  # failing folders named in the summary line


@dataclass(frozen=True)
class JobOutcome:
    """What one job of a sweep came to: its folder, its status, its exit code."""

    num: int
    run_dir: str
    status: str  # ok, or the first failing status of its rows (error, oom, interrupted, ...)
    code: int  # 0 ok, 1 failed, 2 bad config (as a single run would exit)
    kept: bool = False  # resume found every row already there: nothing was measured


def job_outcome_value(run_dir: Path, rows: list[dict], code: int) -> dict:
    """The task function's return value: what the sweeper needs to know about the job."""
    failing = [r.get("status") for r in rows if r.get("status") not in ("ok", "skipped")]
    status = "ok" if code == 0 else next((s for s in failing if s), "error")
    kept = bool(rows) and all(r.get("_kept") for r in rows)  # harness/job/folder.py KEPT
    return {"run_dir": str(run_dir), "status": status, "code": code, "kept": kept}


def summary_line(outcomes: Sequence[JobOutcome]) -> str:
    """``4 jobs: 3 ok, 1 error: runs/sweeps/2026-11-30/12-00-00/2``"""
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    line = f"{len(outcomes)} jobs: " + ", ".join(f"{n} {status}" for status, n in counts.items())
    kept = sum(o.kept for o in outcomes)
    if kept:
        line += (f" ({len(outcomes) - kept} measured, {kept} kept from an earlier run by resume)" if kept < len(outcomes)
                 else " (all kept from an earlier run by resume: nothing was measured; FRESH=1 measures them again)")
    failed = [o for o in outcomes if o.code]
    if failed:
        named = ", ".join(o.run_dir for o in failed[:SHOWN_FAILURES])
        more = f" and {len(failed) - SHOWN_FAILURES} more" if len(failed) > SHOWN_FAILURES else ""
        line += f": {named}{more}"
    return line
