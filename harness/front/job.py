"""A composed config into one job: resolved under the run folder's lock, or an error row.

The front door every job goes through (``python -m harness``, each job of a sweep,
``python -m harness.replay``). A config that does not resolve gets its ``status=error``
row here and never reaches harness/job/; one that does is handed to
``harness.job.execute``, which runs its impls. Failures never escape as a traceback
wall: Ctrl-C or SIGTERM gives the running impl an ``interrupted`` row and exits 130 or
143 (harness/job/interrupts.py).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from omegaconf import DictConfig, OmegaConf

from kvbench.harness.config import Config
from kvbench.harness.errors import ConfigError
from kvbench.harness.front.groups import impls_to_run
from kvbench.harness.front.resolve import resolve
from kvbench.harness.job.folder import RunFolder, RunFolderError
from kvbench.harness.untrusted import UntrustedError
from kvbench.harness.job.interrupts import JobInterrupted, stop_on_signals
from kvbench.harness.results import TableWriteError, run_id, write_run


def _raw_identifiers(raw: DictConfig, run_dir: Path) -> dict:
    """Best-effort identifiers of a config that failed to resolve."""
    def get(key):
        try:  # a value that cannot resolve (``${oc.env:NOPE}``) is not an identifier: left empty
            return OmegaConf.select(raw, key, default=None, throw_on_missing=False, throw_on_resolution_failure=False)
        except Exception:  # noqa: BLE001 - any resolver's own error: the row is written with what is known
            return None

    return {"run_id": run_id(run_dir), "scenario": get("scenario.name"), "impl": get("impl.name"),
            "model": get("model.name"), "dtype": get("dtype"), "batch": get("batch"),
            "block_size": get("block_size"), "seed": get("seed"), "workload": get("workload.name")}


def run_job(raw: DictConfig | Config, run_dir: Path, extra: dict | None = None, sweep_dir: Path | None = None,
            on_claimed: Callable[[Path], None] | None = None) -> tuple[list[dict], int]:
    """Run one job into ``run_dir``; returns its rows and an exit code (0 ok, 1 failed, 2 bad config or folder).

    ``extra`` columns go into every row this run writes (a replay's provenance). In a sweep
    (``sweep_dir``) the job's folder is the one its identity names (harness/job/folder.py
    ``sweep_home``). ``on_claimed(folder)`` runs once the folder is this job's. Raises
    ``JobInterrupted`` (exit 130/143, no traceback) after writing the interrupted row.
    """
    raw_cfg = raw if isinstance(raw, DictConfig) else OmegaConf.structured(raw)
    folder = RunFolder(run_dir)
    try:
        with stop_on_signals(), folder.locked():
            return _run_locked(raw_cfg, folder, extra or {}, sweep_dir, on_claimed)
    except (RunFolderError, UntrustedError) as e:  # the row is not written: the folder is not this run's to write
        return [{**_raw_identifiers(raw_cfg, run_dir), "status": "error", "error": f"{type(e).__name__}: {e}"}], 2
    except TableWriteError as e:  # the folder keeps its earlier tables whole; this run's rows are not in it
        print(f"kvbench: {e}; the rows of this run are not in {run_dir}", file=sys.stderr)
        return [{**_raw_identifiers(raw_cfg, run_dir), "status": "error", "error": f"TableWriteError: {e}"}], 1
    except JobInterrupted as e:
        print(f"kvbench: interrupted by {e.signal_name}; the finished impls' rows are in {run_dir} "
              "(resume=true runs the rest)", file=sys.stderr)
        raise


def _run_locked(raw_cfg: DictConfig, folder: RunFolder, extra: dict, sweep_dir: Path | None,
                on_claimed: Callable[[Path], None] | None) -> tuple[list[dict], int]:
    try:
        cfg = resolve(raw_cfg)
    except ConfigError as e:
        folder.refuse_other(None)  # an unresolvable config has no identity: never over another job's files
        folder.clear(None)
        row = {**_raw_identifiers(raw_cfg, folder.path), **extra, "status": "error", "error": f"ConfigError: {e}"}
        write_run(folder.path, [row])
        if on_claimed is not None:
            on_claimed(folder.path)
        return [row], 2
    # Imported once the config resolved: it loads torch and the impls, which a config error never needs.
    from kvbench.harness.job.execute import execute

    return execute(cfg, folder, impls_to_run(cfg), extra, sweep_dir, on_claimed)
