"""The KV budget of a job that runs the model: measured once per job (harness/kv/budget.py
``measured_kv_budget``) and shared by its impls. A bookkeeping scenario sizes its budget from the shape
alone (``kv_budget``) and never receives this piece."""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.harness.kv.budget import MemoryBudget, measured_kv_budget
from kvbench.harness.scenarios.compute import Compute
from kvbench.harness.scenarios.job_run import JobRun
from kvbench.harness.scenarios.job_workload import JobWorkload


@dataclass
class JobBudget:
    job: JobRun  # the config, the device, and the memo the budget is kept in
    workload: JobWorkload  # its prompt lengths size the activations
    compute: Compute  # the model and pieces, built only once the analytic budget leaves room for them

    def measured(self) -> MemoryBudget:
        """The budget, measured on the job's first call; every later call (each impl's, in its own process
        too: the memo travels) gets the same."""
        memo = self.job.memo
        if "budget" not in memo:
            memo["budget"] = measured_kv_budget(self.job.cfg, self.job.device,
                                                [len(r.prompt_ids) for r in self.workload.requests],
                                                lambda: self.compute.model, lambda: self.compute.decode_pieces)
        return memo["budget"]
