"""What a served run reports, whether the decode engine ran it or the simulator did: one record.

Both run the same ``Scheduler`` over an allocator, so the same figures come out of both (the capacity and
decode scenarios' rows compare them: tests/unit/harness/serving/test_simulator.py). ``EngineResult``
(harness/serving/engine.py) and ``Simulation`` (harness/serving/simulator.py) extend this record with what
only one of them has (wall times and counters; simulated time and jumps), and ``bookkeeping_columns`` makes
the row columns they share, in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from kvbench.harness.measure.kv_peaks import KVPeaks
from kvbench.harness.serving.sequence import Sequence
from kvbench.harness.serving.timeline import StepRecord


@dataclass(kw_only=True)
class ServedRun:
    # The finished sequences in (request_id, sample) order; the simulator keeps them only with a clock.
    sequences: list[Sequence]
    rejected: list[tuple[Sequence, str]]  # requests that can never fit, with why
    peak_running: int  # the most sequences running at once
    max_concurrency: int  # the most sequences running at once before the first preemption
    preemptions: int
    peaks: KVPeaks  # the cache's own accounting, its peaks over the run
    decode_steps: int  # model decode steps (a simulated jump of k counts k)
    prefill_steps: int = 0  # steps that ran prefill work alone (chunked prefill's mixed steps are decode steps)
    # Every step as the observers saw it (the simulator's: one record a jump of many decode steps).
    records: list[StepRecord] = field(default_factory=list)
    # The run's length on its clock: wall seconds, or simulated ones (None: a simulation without a clock).
    elapsed_s: Optional[float] = None
    idle_s: float = 0.0  # time with nothing arrived and nothing running (the run's clock: wall or simulated)
    cache_hit_tokens: int = 0  # prompt tokens served from the prefix cache, not computed
    # The pool's own event counts as row columns (a host tier's hits and copies).
    counters: dict[str, int] = field(default_factory=dict)

    @property
    def total_steps(self) -> int:
        return self.prefill_steps + self.decode_steps

    def bookkeeping_columns(self) -> dict:
        """The row columns of the scheduler's and the cache's bookkeeping (harness/results/schema.py)."""
        return {
            "decode_steps": self.decode_steps,
            "prefill_steps": self.prefill_steps,
            "cache_hit_tokens": self.cache_hit_tokens,
            **self.counters,
            "peak_concurrency": self.peak_running,
            "max_concurrency": self.max_concurrency,
            "preemptions": self.preemptions,
            "rejected": len(self.rejected),
            **self.peaks.as_row(),
        }
