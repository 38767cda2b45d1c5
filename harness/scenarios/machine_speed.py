"""The machine's speed around each wall run of a validating profile job (``scenario=profile`` with ``wall=true``).

Why: on the shared 2-core CPU machines the same steps run at different speeds minutes apart, and not by a little.
In the run published before this module (results/cpu-amd-epyc-2core/clock, commit 49c81e75), paged_cuda's wall
decode steps took 1.42-1.55x their price on the job's profile in every batch bucket of its 5 req/s run, 0.98-1.00x
at 10 req/s and 0.83-0.94x at 20 and 30 req/s; contiguous's 1.15-1.37x at 5 and 0.78-0.86x at 30. A factor that
does not depend on the step's shape, and moves from one run to the next: the machine, not the clock. Priced
from the profile pooled over the job, those runs' TPOT errors were -40% and +7%.

So the job times a few points of its grid again right before its first wall run and after each one (a few
hundred milliseconds a time at tiny scale), and the simulated twin of wall run i is priced on the profile scaled
by the machine's speed around it: the median over those points of (their seconds in the passes before and after
run i) / (their seconds in the whole profile). What stays for the validation to find is the clock's own error:
interpolation over the grid, batch composition, the scheduler's queue; the row says the factor
(``machine_speed``), and the report shows it beside each pair. The points are the grid's middle batch at every
other context, and its second prefill point: both kinds of step, short enough to run often.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from kvbench.harness.config import ImplConfig
from kvbench.harness.scenarios.profile_grid import GridSampler
from kvbench.harness.scenarios.wall_check import drift

if TYPE_CHECKING:  # reading a config imports this module; running it loads torch
    from kvbench.harness.scenarios.compute import Compute
    from kvbench.harness.scenarios.job_run import JobRun
    from kvbench.harness.scenarios.job_workload import JobWorkload


def probe_grid(grid: tuple[list[int], list[int], list[int]]) -> tuple[list[int], list[int], list[int]]:
    """The points timed around each wall run: the middle batch at every other context, the second prefill point."""
    batches, contexts, prefill = grid
    return [batches[len(batches) // 2]], contexts[::2], prefill[1:2] or prefill


class SpeedProbe:
    """A few grid points timed before the first of ``runs`` wall runs and after each one."""

    def __init__(self, job: JobRun, workload: JobWorkload, compute: Compute, impl: ImplConfig,
                 grid: tuple[list[int], list[int], list[int]]) -> None:
        self.sampler = GridSampler(job, workload, compute, impl, probe_grid(grid))

    def bracket(self, tasks: list[Callable[[], None]], runs: int) -> list[Callable[[], None]]:
        """``tasks`` with a timing before the first and after each of the first ``runs`` (the wall runs; what
        follows them, the max-rate search, is left as it is)."""
        out: list[Callable[[], None]] = [self.sampler.measure_pass]
        for i, task in enumerate(tasks):
            out.append(task)
            if i < runs:
                out.append(self.sampler.measure_pass)
        return out

    def speed(self, run: int, profile_rows: list[dict]) -> float | None:
        """How much slower (> 1) or faster the machine ran around wall run ``run`` than over the whole profile;
        None when it was not timed around that run."""
        if run + 2 > len(self.sampler.passes):
            return None
        moved = drift(profile_rows, self.sampler.rows(slice(run, run + 2)))
        return None if moved is None else 1.0 + moved
