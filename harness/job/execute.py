"""One resolved job: run its scenario for each impl and write the run folder as each finishes.

A crash mid-run becomes that impl's row with ``status`` and ``error``, so a sweep goes
on with the next job. Each impl's row is written as soon as that impl finishes. The
folder is this job's alone (harness/job/folder.py), and ``resume=true`` keeps what an
earlier attempt of the same job finished.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from omegaconf import OmegaConf

from kvbench.harness.config import Config, ImplConfig
from kvbench.harness.job.folder import KEPT, RunFolder, sweep_home
from kvbench.harness.job.identity import job_id
from kvbench.harness.job.impl_runner import ImplResult, run_impl
from kvbench.harness.job.interrupts import JobInterrupted
from kvbench.harness.job.isolation import run_in_process
from kvbench.harness.measure.fingerprint import collect, env_record
from kvbench.harness.results import atomic_write, measured_at, write_json
from kvbench.harness.results.vllm_json import write_vllm_results
from kvbench.harness.scenarios.context import JobContext


def exit_code(row: dict) -> int:
    """The exit code a kept row stands for (as when it was first run)."""
    if row.get("status") in ("ok", "skipped"):
        return 0
    return 2 if str(row.get("error") or "").startswith("ConfigError") else 1


def execute(cfg: Config, folder: RunFolder, impls: list[ImplConfig], extra: dict, sweep_dir: Path | None = None,
            on_claimed: Callable[[Path], None] | None = None) -> tuple[list[dict], int]:
    """Each of ``impls`` not already finished in ``folder`` (locked by the caller); returns the rows and the exit code.

    ``sweep_dir``: the job is one of a sweep there, and its folder is the one its identity names
    (``sweep_home``), which may not be ``folder``. ``on_claimed(path)`` runs once the folder is
    this job's (Hydra's record of the job goes in then: a refused folder is left as it was).
    """
    fingerprint = collect(cfg.device.name)
    jid = job_id(cfg, fingerprint.device_slug)
    home = sweep_home(sweep_dir, folder.path, jid) if sweep_dir is not None else folder.path
    if home == folder.path:
        return _execute_in(cfg, folder, impls, extra, fingerprint, jid, on_claimed)
    print(f"kvbench: job_id {jid} is the job of {home}, not of {folder.path} (a changed sweep): it runs there")
    with RunFolder(home).locked() as own:
        return _execute_in(cfg, own, impls, extra, fingerprint, jid, on_claimed)


def _execute_in(cfg: Config, folder: RunFolder, impls: list[ImplConfig], extra: dict, fingerprint, jid: str,
                on_claimed: Callable[[Path], None] | None) -> tuple[list[dict], int]:
    run_dir = folder.path
    resume = cfg.resume
    if resume and folder.job() is not None and (other := folder.measured_elsewhere(fingerprint.as_dict())):
        print(f"kvbench: resume: {run_dir} holds rows measured on another machine ({other}); measuring them here")
        resume = False
    elif resume and folder.job() is not None and folder.shipped():
        print(f"kvbench: resume: {run_dir} holds the rows published with this checkout (committed, unchanged), "
              "not this machine's; measuring them here")
        resume = False
    previous = folder.claim(jid, fingerprint.device_slug, resume)
    if on_claimed is not None:
        on_claimed(run_dir)
    todo = [impl for impl in impls if not previous.done(impl.name)]
    if previous.rows and not todo:
        rows = [{**r, KEPT: True} for impl in impls for r in previous.rows_of(impl.name)]
        print(f"kvbench: resume: {run_dir} already holds this job's finished rows (job_id {jid}); nothing to run")
        return rows, max(map(exit_code, rows), default=0)
    previous = previous.without({impl.name for impl in todo})
    atomic_write(run_dir / "config.yaml", lambda tmp: OmegaConf.save(OmegaConf.structured(cfg), tmp))
    write_json(run_dir / "env.json", env_record(fingerprint, with_torch=not cfg.scenario.bookkeeping))
    ctx = JobContext(cfg, run_dir, fingerprint, tokens=previous.tokens, tables=previous.tables)
    by_impl = {impl.name: previous.rows_of(impl.name) for impl in impls}  # the order rows are written in
    code = max((exit_code(r) for rows in by_impl.values() for r in rows), default=0)
    run_one = run_in_process if cfg.isolation == "process" else run_impl

    def stamp(rows: list[dict]) -> list[dict]:
        now = measured_at()  # when the impl finished: its rows' time (a kept row keeps its own)
        return [{**r, "job_id": jid, "measured_at": r.get("measured_at") or now, **extra} for r in rows]

    def write() -> None:
        so_far = [r for rows in by_impl.values() for r in rows]
        folder.write(so_far, ctx.out.tokens, ctx.out.tables)
        write_vllm_results(run_dir, so_far, ctx.out.tables.get("requests"), cfg.arrival.burstiness)  # vllm-<impl>.json

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
