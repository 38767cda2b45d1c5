"""A run's timeline as two tidy tables: one row per request sample, one row per scheduler step.

Both the decode engine (wall clock) and the capacity simulator (simulated clock)
fill the same records, so the tables, metrics and plots are shared.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable

import pandas as pd

from harness.sequence import Sequence

REQUEST_COLUMNS = ["impl", "run_id", "request_id", "sample", "prompt_len", "output_len", "arrival_s",
                   "admitted_s", "first_token_s", "finish_s", "preemptions"]
STEP_COLUMNS = ["impl", "run_id", "t_s", "kind", "steps", "batch", "tokens", "running", "waiting",
                "kv_used_bytes", "kv_reserved_bytes", "preemptions"]


@dataclass(frozen=True)
class StepRecord:
    """One scheduler step on the run's clock."""

    t_s: float  # when the step finished
    kind: str  # prefill | decode
    batch: int  # sequences the step advanced
    tokens: int  # tokens the forward computed
    running: int
    waiting: int  # arrived, not admitted
    kv_used_bytes: int
    kv_reserved_bytes: int
    preemptions: int  # in this step


def requests_table(finished: Iterable[Sequence], impl: str, run_id: str) -> pd.DataFrame:
    rows = [{"impl": impl, "run_id": run_id, "request_id": s.request_id, "sample": s.sample,
             "prompt_len": len(s.prompt_ids), "output_len": len(s.output_ids), "arrival_s": s.arrival_s,
             "admitted_s": s.admitted_s, "first_token_s": s.first_token_s, "finish_s": s.finish_s,
             "preemptions": s.preempted} for s in finished]
    return pd.DataFrame(rows, columns=REQUEST_COLUMNS)


def steps_table(steps: Iterable[StepRecord], impl: str, run_id: str) -> pd.DataFrame:
    return pd.DataFrame([{"impl": impl, "run_id": run_id, "steps": 1, **asdict(r)} for r in steps],
                        columns=STEP_COLUMNS)


def simulated_steps_table(records: Iterable, impl: str, run_id: str) -> pd.DataFrame:
    """The simulator's records (harness/simulator.py ``StepRecord``, timed by a clock) as the same
    table: a decode record of ``steps`` model steps is one row, at the time its last step ends."""
    rows = [{"impl": impl, "run_id": run_id, "t_s": r.start_s + r.duration_s, "kind": r.kind, "steps": r.steps,
             "batch": r.batch, "tokens": r.tokens, "running": r.batch if r.kind == "decode" else None,
             "waiting": r.waiting, "kv_used_bytes": r.kv_used_bytes, "kv_reserved_bytes": r.kv_reserved_bytes,
             "preemptions": r.preemptions} for r in records]
    return pd.DataFrame(rows, columns=STEP_COLUMNS)


def append_table(tables: dict[str, pd.DataFrame], name: str, frame: pd.DataFrame) -> None:
    """Add one impl's rows to a run's side table (every impl of a job shares the folder's table)."""
    tables[name] = frame if name not in tables else pd.concat([tables[name], frame], ignore_index=True)
