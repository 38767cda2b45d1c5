"""One impl of a job: run its scenario and turn any failure into its row (never a traceback wall)."""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass

from kvbench.harness.kv.budget import out_of_memory_message
from kvbench.harness.config import ImplConfig
from kvbench.harness.scenarios.context import JobContext
from kvbench.harness.errors import ConfigError
from kvbench.harness.scenarios import module as scenario_module
from kvbench.kernels.registry import kv_dtype_refusal

log = logging.getLogger("kvbench")


@dataclass
class ImplResult:
    rows: list[dict]
    code: int  # 0 ok, 1 failed, 2 bad config


def failure_row(exc: BaseException) -> dict:
    if (oom := out_of_memory_message(exc)) is not None:  # torch's, Python's and the CPU allocator's
        return {"status": "oom", "error": oom}
    return {"status": "error", "error": f"{type(exc).__name__}: {exc}".strip()}


def run_impl(ctx: JobContext, impl: ImplConfig) -> ImplResult:
    """The scenario's rows for ``impl``, or one failure row. ``JobInterrupted`` (a SystemExit) passes."""
    try:  # the identifiers draw the workload (its digest): a MemoryError there is this impl's oom row too
        base = ctx.identifiers(impl)
    except ConfigError as e:
        return ImplResult([{**ctx.identifiers(impl, workload=False), "status": "error", "error": f"ConfigError: {e}"}], 2)
    except Exception as e:  # noqa: BLE001
        return ImplResult([{**ctx.identifiers(impl, workload=False), **failure_row(e)}], 1)
    cfg = ctx.job.cfg
    refusal = kv_dtype_refusal(impl.kernel, cfg.kv_dtype)
    if refusal is not None and not cfg.scenario.bookkeeping:  # bookkeeping runs no kernel: any kv_dtype
        return ImplResult([{**base, "status": "skipped", "error": refusal}], 0)
    # Process-wide: a sweep's later job must not inherit an earlier one's. A bookkeeping run
    # (scenario=capacity) computes nothing with tensors, so it leaves torch unimported (a second saved).
    if cfg.device.name == "cpu" and not cfg.scenario.bookkeeping:
        import torch

        torch.set_num_threads(ctx.job.cpu_threads)
    try:
        scenario = scenario_module(cfg.scenario.name)  # its ``run`` gets the pieces its signature names
        return ImplResult([{**base, **metrics} for metrics in ctx.call(scenario.run, impl)], 0)
    except ConfigError as e:
        return ImplResult([{**base, "status": "error", "error": f"ConfigError: {e}"}], 2)
    except Exception as e:  # noqa: BLE001 - any failure becomes a row, the sweep goes on
        log.debug("impl failed", exc_info=True)
        return ImplResult([{**base, **failure_row(e), "traceback": traceback.format_exc(limit=8)}], 1)
    finally:
        if cfg.device.name == "cuda":
            import torch

            torch.cuda.empty_cache()
