"""One job's pieces, assembled once and handed to its scenario by name.

harness/job/ builds a ``JobContext`` per job (per impl process under ``isolation=process``) and calls the
scenario's ``run`` through ``call``, which passes the pieces that ``run``'s signature names and no others:

- ``job`` (job_run.py ``JobRun``): the config, run folder, machine, memo and row identifiers; every scenario;
- ``workload`` (job_workload.py ``JobWorkload``): the requests, their arrivals and digest, the closed loop;
- ``compute`` (compute.py ``Compute``): the model, its pieces and compiled decode, sync and progress;
- ``budget`` (job_budget.py ``JobBudget``): the KV budget measured with the model;
- ``out`` (outputs.py ``Outputs``): the side tables and tokens the job writes.

A search (max_rate, max_concurrency, a profile's validation) runs probes of other configs of the same job:
``probe`` makes each its own pieces, sharing the parent's built model.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Callable

from kvbench.harness.config import Config, ImplConfig
from kvbench.harness.measure.fingerprint import Fingerprint
from kvbench.harness.scenarios.compute import Compute
from kvbench.harness.scenarios.job_budget import JobBudget
from kvbench.harness.scenarios.job_run import JobRun
from kvbench.harness.scenarios.job_workload import JobWorkload
from kvbench.harness.scenarios.outputs import Outputs
from kvbench.harness.serving.workload import draw_workload

PIECES = ("job", "workload", "compute", "budget", "out")  # what a scenario's ``run`` may name, besides ``impl``


class JobContext:
    """The pieces of one job; ``memo`` (the values decided once per job) is the one a parent process handed
    over (harness/job/isolation.py), or a fresh one."""

    def __init__(self, cfg: Config, run_dir: Path, fingerprint: Fingerprint, tokens: list[dict] | None = None,
                 tables: dict | None = None, memo: dict | None = None) -> None:
        self.job = JobRun(cfg, run_dir, fingerprint, {} if memo is None else memo)
        # The drawing is this module's name for it, looked up as each job is assembled: the one seam a test
        # has to make drawing fail (tests/jobs/test_cli.py, a MemoryError while drawing is an oom row).
        self.workload = JobWorkload(cfg, self.job.memo, draw_workload)
        self.compute = Compute(self.job, self.workload)
        self.budget = JobBudget(self.job, self.workload, self.compute)
        self.out = Outputs({} if tables is None else tables, [] if tokens is None else tokens)

    def call(self, fn: Callable[..., list[dict]], impl: ImplConfig, **options) -> list[dict]:
        """``fn(impl=impl, **options)`` with each piece its signature names (``PIECES``) passed by name."""
        params = inspect.signature(fn).parameters
        unknown = [name for name, p in params.items() if name not in (*PIECES, "impl", *options)
                   and p.default is p.empty]
        if unknown:
            raise TypeError(f"{fn.__module__}.{fn.__qualname__} asks for {unknown}: a scenario receives impl "
                            f"and any of {list(PIECES)} (harness/scenarios/context.py)")
        return fn(impl=impl, **{name: getattr(self, name) for name in params if name in PIECES}, **options)

    def identifiers(self, impl: ImplConfig | None, workload: bool = True) -> dict:
        """The row's identifiers; ``workload=False``: without the drawn workload's digest (drawing it failed)."""
        return self.job.identifiers(impl, self.workload if workload else None)

    def derive(self, cfg: Config) -> JobContext:
        """A probe run of ``cfg`` (``probe``)."""
        return probe(self.job, self.compute, cfg)


def probe(job: JobRun, compute: Compute, cfg: Config) -> JobContext:
    """The pieces of a probe run of ``cfg``: the job's folder and fingerprint; its own workload (drawn for
    ``cfg``), memo, tables and tokens; the parent's built model, and its pieces where they fit
    (``Compute.shared_with``)."""
    ctx = JobContext(cfg, job.run_dir, job.fingerprint)
    ctx.compute = compute.shared_with(ctx.job, ctx.workload)
    ctx.budget = JobBudget(ctx.job, ctx.workload, ctx.compute)
    return ctx
