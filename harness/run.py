"""One Hydra job: resolve the config, run the scenario for each impl, write the run folder.

Failures never escape as a traceback wall and never lose the row: a bad config
or a crash mid-run becomes a row with ``status`` and ``error``, so a multirun
sweep goes on with the next job.
"""

from __future__ import annotations

import importlib
import logging
import traceback
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from harness.budget import out_of_memory_message
from harness.config import Config, ImplConfig
from harness.context import RunContext, run_id
from harness.errors import ConfigError
from harness.measure.fingerprint import collect
from harness.resolve import impls_to_run, resolve
from harness.results import write_json, write_run, write_tokens

log = logging.getLogger("kvbench")


def _failure_row(exc: BaseException) -> dict:
    if (oom := out_of_memory_message(exc)) is not None:  # torch's, Python's and the CPU allocator's
        return {"status": "oom", "error": oom}
    return {"status": "error", "error": f"{type(exc).__name__}: {exc}".strip()}


def _raw_identifiers(raw: DictConfig, run_dir: Path) -> dict:
    """Best-effort identifiers of a config that failed to resolve."""
    def get(key):
        return OmegaConf.select(raw, key, default=None, throw_on_missing=False)

    return {"run_id": run_id(run_dir), "scenario": get("scenario.name"), "impl": get("impl.name"),
            "model": get("model.name"), "dtype": get("dtype"), "batch": get("batch"),
            "block_size": get("block_size"), "seed": get("seed"), "workload": get("workload.name")}


def run_job(raw: DictConfig | Config, run_dir: Path) -> tuple[list[dict], int]:
    """Run one job into ``run_dir``; returns its rows and an exit code (0 ok, 1 failed, 2 bad config)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    raw_cfg = raw if isinstance(raw, DictConfig) else OmegaConf.structured(raw)
    try:
        cfg = resolve(raw_cfg)
    except ConfigError as e:
        row = {**_raw_identifiers(raw_cfg, run_dir), "status": "error", "error": f"ConfigError: {e}"}
        write_run(run_dir, [row])
        return [row], 2
    OmegaConf.save(OmegaConf.structured(cfg), run_dir / "config.yaml")
    ctx = RunContext(cfg, run_dir, collect(cfg.device.name))
    write_json(run_dir / "env.json", ctx.fingerprint.as_dict())
    scenario = importlib.import_module(f"harness.scenarios.{cfg.scenario.name}")
    rows, code = [], 0
    for impl in impls_to_run(cfg):
        base = ctx.identifiers(impl)
        try:
            for metrics in scenario.run(ctx, impl):
                rows.append({**base, **metrics})
        except ConfigError as e:
            rows.append({**base, "status": "error", "error": f"ConfigError: {e}"})
            code = max(code, 2)
        except Exception as e:  # noqa: BLE001 - any failure becomes a row, the sweep goes on
            log.debug("job failed", exc_info=True)
            rows.append({**base, **_failure_row(e), "traceback": traceback.format_exc(limit=8)})
            code = max(code, 1)
        finally:
            if ctx.device.type == "cuda":
                torch.cuda.empty_cache()
    write_run(run_dir, rows, ctx.tables)
    if ctx.tokens:
        write_tokens(run_dir / "tokens.jsonl", ctx.tokens)
    return rows, code
