"""One Hydra job: resolve the config, run the scenario for each impl, write the run folder.

Failures never escape as a traceback wall and never lose the row: a bad config
or a crash mid-run becomes a row with ``status`` and ``error``, so a multirun
sweep goes on with the next job. Each impl's row is written as soon as that impl
finishes; Ctrl-C or SIGTERM gives the running impl an ``interrupted`` row and
exits 130 or 143 (harness/interrupts.py). The folder is this job's alone
(harness/run_folder.py), and ``resume=true`` keeps what an earlier attempt of the
same job finished.
"""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from harness.config import Config, ImplConfig
from harness.errors import ConfigError
from harness.interrupts import JobInterrupted, stop_on_signals
from harness.job_identity import job_id
from harness.measure.fingerprint import collect
from harness.resolve import impls_to_run, resolve
from harness.results import atomic_write, run_id, write_json, write_run
from harness.run_folder import RunFolder, RunFolderError


def _raw_identifiers(raw: DictConfig, run_dir: Path) -> dict:
    """Best-effort identifiers of a config that failed to resolve."""
    def get(key):
        return OmegaConf.select(raw, key, default=None, throw_on_missing=False)

    return {"run_id": run_id(run_dir), "scenario": get("scenario.name"), "impl": get("impl.name"),
            "model": get("model.name"), "dtype": get("dtype"), "batch": get("batch"),
            "block_size": get("block_size"), "seed": get("seed"), "workload": get("workload.name")}


def _code(row: dict) -> int:
    """The exit code a kept row stands for (as when it was first run)."""
    if row.get("status") in ("ok", "skipped"):
        return 0
    return 2 if str(row.get("error") or "").startswith("ConfigError") else 1


def run_job(raw: DictConfig | Config, run_dir: Path, extra: dict | None = None) -> tuple[list[dict], int]:
    """Run one job into ``run_dir``; returns its rows and an exit code (0 ok, 1 failed, 2 bad config or folder).

    ``extra`` columns go into every row this run writes (a replay's provenance). Raises
    ``JobInterrupted`` (exit 130/143, no traceback) after writing the interrupted row.
    """
    raw_cfg = raw if isinstance(raw, DictConfig) else OmegaConf.structured(raw)
    folder = RunFolder(run_dir)
    try:
        with stop_on_signals(), folder.locked():
            return _run_locked(raw_cfg, folder, extra or {})
    except RunFolderError as e:  # the row is not written: the folder is not this run's to write
        return [{**_raw_identifiers(raw_cfg, run_dir), "status": "error", "error": f"RunFolderError: {e}"}], 2
    except JobInterrupted as e:
        print(f"kvbench: interrupted by {e.signal_name}; the finished impls' rows are in {run_dir} "
              "(resume=true runs the rest)", file=sys.stderr)
        raise


def _run_locked(raw_cfg: DictConfig, folder: RunFolder, extra: dict) -> tuple[list[dict], int]:
    run_dir = folder.path
    try:
        cfg = resolve(raw_cfg)
    except ConfigError as e:
        folder.refuse_other(None)  # an unresolvable config has no identity: never over another job's files
        folder.clear(None)
        row = {**_raw_identifiers(raw_cfg, run_dir), **extra, "status": "error", "error": f"ConfigError: {e}"}
        write_run(run_dir, [row])
        return [row], 2
    # Imported once the config resolved: they load torch and the impls, which a config error never needs.
    from harness.context import RunContext
    from harness.impl_runner import ImplResult, run_impl
    from harness.isolation import run_in_process

    fingerprint = collect(cfg.device.name)
    jid = job_id(cfg, fingerprint.device_slug)
    previous = folder.claim(jid, fingerprint.device_slug, cfg.resume)
    impls = impls_to_run(cfg)
    todo = [impl for impl in impls if not previous.done(impl.name)]
    if previous.rows and not todo:
        rows = [r for impl in impls for r in previous.rows_of(impl.name)]
        print(f"kvbench: resume: {run_dir} already holds this job's finished rows (job_id {jid}); nothing to run")
        return rows, max(map(_code, rows), default=0)
    previous = previous.without({impl.name for impl in todo})
    atomic_write(run_dir / "config.yaml", lambda tmp: OmegaConf.save(OmegaConf.structured(cfg), tmp))
    write_json(run_dir / "env.json", fingerprint.as_dict())
    ctx = RunContext(cfg, run_dir, fingerprint, tokens=previous.tokens, tables=previous.tables)
    by_impl = {impl.name: previous.rows_of(impl.name) for impl in impls}  # the order rows are written in
    code = max((_code(r) for rows in by_impl.values() for r in rows), default=0)
    run_one = run_in_process if cfg.isolation == "process" else run_impl

    def stamp(rows: list[dict]) -> list[dict]:
        return [{**r, "job_id": jid, **extra} for r in rows]

    def write() -> None:
        folder.write([r for rows in by_impl.values() for r in rows], ctx.tokens, ctx.tables)

    running: ImplConfig | None = None
    try:
        for impl in todo:
            running = impl
            result: ImplResult = run_one(ctx, impl)
            by_impl[impl.name] = stamp(result.rows)
            code = max(code, result.code)
            running = None
            write()
    except JobInterrupted as e:
        if running is not None:
            by_impl[running.name] = stamp([{**ctx.identifiers(running), "status": "interrupted",
                                            "error": f"interrupted by {e.signal_name}"}])
        write()
        raise
    return [r for rows in by_impl.values() for r in rows], code

