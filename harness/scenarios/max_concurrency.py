"""scenario=max_concurrency: the largest batch an impl serves with every sequence resident.

Grows the batch (1, 2, 4, ...) until a probe fails, then bisects. A probe runs
the workload's first ``b`` requests with ``batch=b`` and passes when all ``b``
sequences were resident at once with no preemption, rejection or out-of-memory.
``scenario.probe=decode`` runs the real model on the device (vLLM-style budget,
or ``device.memory_gb`` on CPU); ``probe=capacity`` runs the bookkeeping only.
The analytic prediction (vLLM's formula) sits beside it in the row.
"""

from __future__ import annotations

import copy
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvbench.harness.config import ImplConfig, SearchScenario
from kvbench.harness.errors import ConfigError

if TYPE_CHECKING:  # reading a config imports this module; running it loads torch
    from kvbench.harness.scenarios.compute import Compute
    from kvbench.harness.scenarios.context import JobContext
    from kvbench.harness.scenarios.job_budget import JobBudget
    from kvbench.harness.scenarios.job_run import JobRun
    from kvbench.harness.scenarios.job_workload import JobWorkload


@dataclass
class MaxConcurrencyScenario(SearchScenario):
    """The largest batch served with every sequence resident (harness/scenarios/max_concurrency.py)."""

    name: str = "max_concurrency"
    search_limit: int = 4096  # stop growing the batch here


SCHEMA = MaxConcurrencyScenario


def _probe(job: JobRun, compute: Compute, b: int) -> JobContext:
    from kvbench.harness.scenarios.context import probe

    cfg = copy.deepcopy(job.cfg)
    cfg.batch = b
    cfg.workload.num_requests = b
    cfg.repeat = 1
    return probe(job, compute, cfg)


def _passes(job: JobRun, compute: Compute, impl: ImplConfig, b: int) -> bool:
    import torch

    from kvbench.harness.kv.budget import kv_budget
    from kvbench.harness.kv.factory import build_allocator, usage_unit_bytes

    probe = _probe(job, compute, b)
    cfg = probe.job.cfg
    want = b * cfg.workload.n
    if job.cfg.scenario.probe == "capacity":
        from kvbench.harness.serving.simulator import simulate

        alloc = build_allocator(impl, cfg, kv_budget(cfg).kv_bytes)
        sim = simulate(alloc, probe.workload.requests, want, cfg.max_num_batched_tokens, cfg.model.vocab_size,
                       usage_unit_bytes(alloc, cfg))  # a grouped pool counts layer slots
        return not sim.preemptions and not sim.rejected and sim.peak_running == want
    from kvbench.harness.scenarios import decode

    try:
        (row,) = probe.call(decode.measure, impl, warmup=0)
    except (torch.OutOfMemoryError, ConfigError):
        return False
    finally:
        probe.out.tokens.clear()
    return not row["preemptions"] and not row["rejected"] and row["peak_concurrency"] == want


def search(job: JobRun, compute: Compute, impl: ImplConfig, limit: int) -> tuple[int, int]:
    """(largest passing batch, number of probes): grow by doubling, then bisect."""
    probes, good, bad = 0, 0, None
    b = 1
    while b <= limit:
        probes += 1
        if not _passes(job, compute, impl, b):
            bad = b
            break
        good, b = b, b * 2
    if bad is None:
        return good, probes
    while bad - good > 1:
        mid = (good + bad) // 2
        probes += 1
        if _passes(job, compute, impl, mid):
            good = mid
        else:
            bad = mid
    return good, probes


def run(job: JobRun, workload: JobWorkload, compute: Compute, budget: JobBudget, impl: ImplConfig) -> list[dict]:
    from kvbench.harness.kv.budget import kv_budget
    from kvbench.harness.kv.factory import analytic_max_concurrency

    cfg = job.cfg
    limit = int(cfg.scenario.search_limit)
    # cpu_compile: decided and compiled once, for this run's workload, before the first probe (which keeps it).
    mode = compute.decode_mode_columns() if cfg.scenario.probe == "decode" else {}
    found, probes = search(job, compute, impl, limit)
    kv = kv_budget(cfg) if cfg.scenario.probe == "capacity" or job.device.type == "cpu" else budget.measured()
    tokens = round(statistics.mean(r.total_len for r in workload.requests))
    return [{
        "status": "ok",
        "notes": f"probe={cfg.scenario.probe}" + (
            f"; reached scenario.search_limit={limit}" if found >= limit else ""),
        "max_concurrency": found,
        "max_concurrency_analytic": analytic_max_concurrency(impl, cfg, kv.kv_bytes, tokens),
        "probes": probes,
        "budget_kv_bytes": kv.kv_bytes,
        **mode,
    }]
