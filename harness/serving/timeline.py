"""A run's timeline as two tidy tables: one row per request sample, one row per scheduler step.

Both the decode engine (wall clock) and the capacity simulator (simulated clock)
fill the same records, so the tables, metrics and plots are shared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import pandas as pd

from kvbench.harness.serving.sequence import Sequence

REQUEST_COLUMNS = ["impl", "run_id", "request_id", "sample", "prompt_len", "output_len", "arrival_s",
                   "admitted_s", "first_token_s", "finish_s", "preemptions"]
STEP_COLUMNS = ["impl", "run_id", "t_s", "kind", "steps", "batch", "tokens", "running", "waiting",
                "kv_used_bytes", "kv_reserved_bytes", "preemptions", "start_s", "duration_s", "kv_tokens_read"]


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One scheduler step, as both clocks record it: the decode engine one per step; the simulator
    one per prefill, or one per jump of ``steps`` decode steps of an unchanged batch."""

    kind: str  # prefill | decode | mixed (chunked prefill: prompt chunks beside the decodes, one forward)
    steps: int  # model steps it stands for (1 but for a simulated jump)
    batch: int  # sequences each step advanced (a prefill: the admitted ones, forks included)
    tokens: int  # tokens computed over all its steps (a prefill: prompt tokens not found in the prefix cache)
    running: int | None  # sequences running after it (None: a simulated prefill)
    waiting: int  # arrived, not admitted, after it
    kv_used_bytes: int  # before its finished sequences are released
    kv_reserved_bytes: int
    preemptions: int = 0  # in its first step
    t_s: float | None = None  # when it finished on the run's clock (None: simulated without a clock)
    # When it started and how long it took (simulated: as priced; the decode engine: on the wall clock),
    # and the KV tokens its FIRST step's decode attention reads (each later step of a jump reads ``batch``
    # more; a simulated prefill: the admitted contexts; the engine's prefill: None).
    start_s: float | None = None
    duration_s: float | None = None
    kv_tokens_read: int | None = None


def requests_table(finished: Iterable[Sequence], impl: str, run_id: str) -> pd.DataFrame:
    rows = [{"impl": impl, "run_id": run_id, "request_id": s.request_id, "sample": s.sample,
             "prompt_len": len(s.prompt_ids), "output_len": len(s.output_ids), "arrival_s": s.arrival_s,
             "admitted_s": s.admitted_s, "first_token_s": s.first_token_s, "finish_s": s.finish_s,
             "preemptions": s.preempted} for s in finished]
    return pd.DataFrame(rows, columns=REQUEST_COLUMNS)


def steps_table(steps: Iterable[StepRecord], impl: str, run_id: str) -> pd.DataFrame:
    """One row per record, on either clock (a simulated jump of ``steps`` decode steps is one row)."""
    return pd.DataFrame([{"impl": impl, "run_id": run_id, **{c: getattr(r, c) for c in STEP_COLUMNS[2:]}}
                         for r in steps], columns=STEP_COLUMNS)


def append_table(tables: dict[str, pd.DataFrame], name: str, frame: pd.DataFrame) -> None:
    """Add one impl's rows to a run's side table (every impl of a job shares the folder's table)."""
    tables[name] = frame if name not in tables else pd.concat([tables[name], frame], ignore_index=True)
