"""Hydra's basic sweep, made to survive a job that does not compose.

Hydra's ``BasicSweeper`` composes every job of a batch before launching it and stops the
whole sweep on the first that fails (``batch=1,abc,2``: a type error; ``model=a,nope``:
an unknown option). This one composes each job the same way, gives a failing job its
error row (in the folder the job would have had) and launches the others through the
configured launcher (basic, joblib, submitit), each under its own job number. At the end
it prints one line (``3 jobs: 2 ok, 1 error: multirun/.../1``) and exits non-zero when any
job failed. On a terminal, tqdm's bar on stderr moves on as each job ends (``SweepProgress``:
job n of N, the counts so far, the ETA and rate); a pipe or a log file gets no bar.
Registered for Hydra as hydra_plugins/kvbench_sweeper (``hydra/sweeper=kvbench``).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from harness.front.composed_once import ComposedOnce
from harness.front.portable import portable
from harness.results import atomic_write

SHOWN_FAILURES = 5  # failing folders named in the summary line
# conf/sweep/ files are named for the device they are the default sweep of (make sweep)
DEVICE_PREFIXES = ("cpu_", "gpu_")


def sweep_folder(sweep: str) -> str:
    """The results folder of the conf/sweep/ file ``sweep``: its name less the device prefix (cpu_kernel: kernel)."""
    return next((sweep.removeprefix(p) for p in DEVICE_PREFIXES if sweep.startswith(p)), sweep)


def register_sweep_folder_resolver() -> None:
    """``${kvbench_sweep_folder:NAME}`` in configs (conf/hydra/sweep_results.yaml): ``sweep_folder(NAME)``."""
    if not OmegaConf.has_resolver("kvbench_sweep_folder"):
        OmegaConf.register_new_resolver("kvbench_sweep_folder", sweep_folder)


@dataclass(frozen=True)
class JobOutcome:
    """What one job of a sweep came to: its folder, its status, its exit code."""

    num: int
    run_dir: str
    status: str  # ok, or the first failing status of its rows (error, oom, interrupted, ...)
    code: int  # 0 ok, 1 failed, 2 bad config (as a single run would exit)
    kept: bool = False  # resume found every row already there: nothing was measured


def job_outcome_value(run_dir: Path, rows: list[dict], code: int) -> dict:
    """The task function's return value: what the sweeper needs to know about the job."""
    failing = [r.get("status") for r in rows if r.get("status") not in ("ok", "skipped")]
    status = "ok" if code == 0 else next((s for s in failing if s), "error")
    kept = bool(rows) and all(r.get("_kept") for r in rows)  # harness/job/folder.py KEPT
    return {"run_dir": str(run_dir), "status": status, "code": code, "kept": kept}


def summary_line(outcomes: Sequence[JobOutcome]) -> str:
    """``4 jobs: 3 ok, 1 error: multirun/2026-11-30/12-00-00/2``"""
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    line = f"{len(outcomes)} jobs: " + ", ".join(f"{n} {status}" for status, n in counts.items())
    kept = sum(o.kept for o in outcomes)
    if kept:
        line += (f" ({len(outcomes) - kept} measured, {kept} kept from an earlier run by resume)" if kept < len(outcomes)
                 else " (all kept from an earlier run by resume: nothing was measured; FRESH=1 measures them again)")
    failed = [o for o in outcomes if o.code]
    if failed:
        named = ", ".join(o.run_dir for o in failed[:SHOWN_FAILURES])
        more = f" and {len(failed) - SHOWN_FAILURES} more" if len(failed) > SHOWN_FAILURES else ""
        line += f": {named}{more}"
    return line


BAR_FORMAT = "{desc}: [{bar:20}] {n_fmt}/{total_fmt} jobs{postfix} [{elapsed}<{remaining}, {rate_fmt}]"


def _on_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a replaced or closed stream
        return False


class _AboveTheBar:
    """A text stream whose lines are written with the sweep's bar cleared, then drawn again under them
    (tqdm's ``external_write_mode`` on the bar's own file: its ``tqdm.write`` guesses the bar's
    file from sys.stdout and sys.stderr, which kvbench wraps, and would write through the bar)."""

    def __init__(self, stream: Any, bar: Any) -> None:
        self._stream, self._bar, self._partial = stream, bar, ""

    def write(self, text: str) -> int:
        self._partial += text
        if "\n" in self._partial:
            lines, _, self._partial = self._partial.rpartition("\n")
            self._write(lines + "\n")
        return len(text)

    def _write(self, text: str) -> None:
        from tqdm import tqdm

        with tqdm.external_write_mode(file=self._bar.fp):
            self._stream.write(text)
            self._stream.flush()

    def flush(self) -> None:
        if self._partial:
            text, self._partial = self._partial, ""
            self._write(text)
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)  # fileno, isatty, encoding, buffer, ...


@dataclass
class SweepProgress:
    """tqdm's bar on stderr, moved on as each job of a sweep ends, e.g.
    ``kvbench: [#####               ] 3/12 jobs, 2 ok, 1 error (job 2: ok) [00:30<01:30, 10.00s/job]``:
    the counts so far (ok and error always shown), the job that just ended, tqdm's elapsed time,
    ETA and rate. On a terminal only: a pipe or a log file (make sweep > log) gets no bar and no
    carriage returns, just the jobs' own output and the summary line. The jobs' own output goes
    above the bar (``output_above``). The ETA is tqdm's, on the measured jobs only: jobs kept by
    resume take no time, so they count as done (``n``) and as tqdm's ``initial``, out of the rate
    (no ETA, ``?``, until one job was measured); smoothing off, so the rate is the mean so far.
    """

    total: int
    enabled: bool = True
    started: float = field(default_factory=time.monotonic)
    # The process that owns the counts. A launcher that runs jobs in other processes (joblib,
    # submitit) pickles the task, and this with it: a copy there must stay silent.
    owner_pid: int = field(default_factory=os.getpid)
    done: dict[int, JobOutcome] = field(default_factory=dict)
    bar: Any = field(default=None, repr=False, compare=False)  # the live tqdm, in the owner on a terminal

    def __getstate__(self) -> dict:
        return {**self.__dict__, "bar": None}  # a worker's copy draws nothing

    def start(self, total: int, enabled: bool) -> None:
        """Size it once the jobs are known, start the clock, and open the bar where it is shown."""
        self.close()
        self.total, self.enabled, self.started = total, enabled, time.monotonic()
        if enabled and _on_terminal(sys.stderr):
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="kvbench", unit="job", bar_format=BAR_FORMAT, smoothing=0,
                            mininterval=0, dynamic_ncols=True, file=sys.stderr)

    @property
    def live(self) -> bool:
        return self.bar is not None and os.getpid() == self.owner_pid

    def _counts(self, outcome: JobOutcome) -> str:
        counts: dict[str, int] = {"ok": 0, "error": 0}  # both always shown: a reader looks for them
        for o in self.done.values():
            counts[o.status] = counts.get(o.status, 0) + 1
        return ", ".join(f"{k} {status}" for status, k in counts.items()) + f" (job {outcome.num}: {outcome.status})"

    def _kept(self) -> int:
        return sum(o.kept for o in self.done.values())

    def line(self, outcome: JobOutcome, now: float | None = None) -> str:
        """What the bar shows after ``outcome`` (tqdm's meter, ``now`` on the monotonic clock)."""
        from tqdm import tqdm

        elapsed = (time.monotonic() if now is None else now) - self.started
        return tqdm.format_meter(len(self.done), self.total, elapsed, prefix="kvbench", unit="job", ascii=" #",
                                 bar_format=BAR_FORMAT, postfix=self._counts(outcome), initial=self._kept())

    def job_done(self, outcome: JobOutcome, draw: bool = True) -> None:
        """Record ``outcome`` and move the bar on, once per job (the task and the sweeper may both report it).

        ``draw=False``: one of several jobs reported at the same moment; only the last is drawn."""
        if os.getpid() != self.owner_pid or outcome.num in self.done:
            return
        self.done[outcome.num] = outcome
        if self.live:
            self.bar.initial = self._kept()
            self.bar.n = len(self.done)
            self.bar.set_postfix_str(self._counts(outcome), refresh=False)
            if draw:
                self.bar.refresh()

    def write(self, message: str) -> None:
        """A line on stderr above the bar (the bar is drawn again under it)."""
        if self.live:
            _AboveTheBar(sys.stderr, self.bar).write(message + "\n")
        else:
            print(message, file=sys.stderr)

    @contextlib.contextmanager
    def output_above(self) -> Iterator[None]:
        """While the bar is drawn, what the sweep prints goes above it (``_AboveTheBar``): stdout (the
        jobs' tables, and the log handlers a job configures on it) and the root logger's console
        handlers (Hydra's ``Launching 2 jobs locally``). stderr itself is left alone: a job's own
        per-impl tqdm bars draw there."""
        if not self.live:
            yield
            return
        handlers = [h for h in logging.root.handlers
                    if isinstance(h, logging.StreamHandler) and h.stream in (sys.stdout, sys.stderr)]
        streams = [h.stream for h in handlers]
        try:
            for h in handlers:
                h.setStream(_AboveTheBar(h.stream, self.bar))
            out = _AboveTheBar(sys.stdout, self.bar)
            with contextlib.redirect_stdout(out):
                try:
                    yield
                finally:
                    out.flush()
        finally:
            for h, stream in zip(handlers, streams):
                h.setStream(stream)

    def close(self) -> None:
        """Leave the bar's last state on the terminal and stop drawing it."""
        if self.live:
            self.bar.close()
        self.bar = None


@dataclass
class ReportingTask:
    """The task function, reporting each job to ``progress`` as it ends in the sweeper's own process.

    Hydra's basic launcher runs every job of a ``launch`` call before it returns; without this the
    progress lines of a whole batch would come at its end. In a launcher's worker process the
    report is a no-op (SweepProgress.owner_pid) and the sweeper reports the job when ``launch`` returns.
    """

    task: TaskFunction
    progress: SweepProgress

    def __call__(self, cfg: DictConfig) -> Any:
        from hydra.core.hydra_config import HydraConfig

        job = HydraConfig.get()
        num, run_dir = int(job.job.num), str(job.runtime.output_dir)
        try:
            value = self.task(cfg)
        except Exception:
            self.progress.job_done(JobOutcome(num, run_dir, "error", 1))
            raise
        self.progress.job_done(outcome_of(num, run_dir, value))
        return value


def outcome_of(num: int, run_dir: str, value: Any) -> JobOutcome:
    """The outcome a finished task's return value (``job_outcome_value``) says."""
    if not isinstance(value, dict):
        return JobOutcome(num, run_dir, "error", 1)
    return JobOutcome(num, value.get("run_dir", run_dir), value["status"], int(value["code"]), bool(value.get("kept")))


def expand(overrides: list, max_batch_size: int | None, first: Sequence[str] | None = None) -> list[list[list[str]]]:
    """Every job's overrides (the cartesian product of the sweeps), in batches: as Hydra's basic sweeper.

    ``first``: patterns of ``key=value`` overrides (``"batch=64 block_size=16"``); the jobs that
    hold every override of a pattern run before the others, in the patterns' order, each group
    in product order (so a run cut short still has the most valuable jobs, for every impl).
    """
    from hydra.errors import HydraException

    axes: dict[str, list[str]] = {}
    for o in overrides:
        key = o.get_key_element()
        if not o.is_sweep_override():
            axes[key] = [f"{key}={o.get_value_element_as_str()}"]
        elif o.is_discrete_sweep():
            axes[key] = [f"{key}={v}" for v in o.sweep_string_iterator()]
        else:
            raise HydraException(f"hydra/sweeper=kvbench does not support sweep type {o.value_type.name}: {key}")
    jobs = [list(combo) for combo in itertools.product(*axes.values())]
    patterns = [set(str(p).split()) for p in first or ()]
    jobs.sort(key=lambda job: next((i for i, pat in enumerate(patterns) if pat <= set(job)), len(patterns)))
    size = max_batch_size if max_batch_size and max_batch_size > 0 else max(1, len(jobs))
    return [jobs[i:i + size] for i in range(0, len(jobs), size)]


class GuardedSweeper(Sweeper):
    def __init__(self, max_batch_size: int | None = None, params: dict[str, str] | None = None,
                 first: Sequence[str] | None = None) -> None:
        self.max_batch_size = max_batch_size
        self.params = dict(params or {})
        self.first = list(first or [])  # job patterns run before the rest (expand)
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.launcher: Launcher | None = None
        self.progress = SweepProgress(total=0)  # sized in sweep(), once the jobs are known

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        hydra_context = HydraContext(config_loader=ComposedOnce(hydra_context.config_loader),
                                     callbacks=hydra_context.callbacks)
        self.hydra_context, self.config = hydra_context, config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=ReportingTask(task_function, self.progress), config=config)

    def sweep(self, arguments: list[str]) -> Any:
        assert self.config is not None and self.launcher is not None and self.hydra_context is not None
        params = [f"{k}={v}" for k, v in self.params.items()] + list(arguments)
        parsed = OverridesParser.create(config_loader=self.hydra_context.config_loader).parse_overrides(params)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        # published: no machine paths; renamed into place, so a link planted there is replaced, never written through
        record = portable(self.config)
        atomic_write(sweep_dir / "multirun.yaml", lambda tmp: OmegaConf.save(record, tmp))

        returns: list[Sequence[JobReturn]] = []
        outcomes: list[JobOutcome] = []
        first = 0
        batches = expand(parsed, self.max_batch_size, self.first)
        # Sized in place: the launcher's ReportingTask holds this same object. progress=false
        # (the sweep's shared value) silences it, as it does the per-impl bars.
        self.progress.start(sum(len(b) for b in batches), bool(OmegaConf.select(self.config, "progress", default=True)))
        try:
            with self.progress.output_above():
                for batch in batches:
                    results, batch_outcomes = self._run_batch(batch, first)
                    returns.append(results)
                    outcomes += batch_outcomes
                    first += len(batch)
        finally:
            self.progress.close()
        self._finish(outcomes)
        return returns

    def _run_batch(self, batch: Sequence[Sequence[str]], first: int) -> tuple[list[JobReturn], list[JobOutcome]]:
        """Launch the jobs that compose, in runs of consecutive job numbers; record the others."""
        results: list[JobReturn] = []
        outcomes: list[JobOutcome] = []
        pending: list[Sequence[str]] = []  # composable jobs, numbered from ``start`` on

        def launch_pending() -> None:
            if pending:
                launched = list(self.launcher.launch(pending, initial_job_idx=start))
                results.extend(launched)
                done = [self._outcome(start + i, r) for i, r in enumerate(launched)]
                outcomes.extend(done)
                # Jobs run in other processes (joblib, submitit) are reported now, all at once; the
                # ones this process ran were reported as they ended (ReportingTask).
                fresh = [o for o in done if o.num not in self.progress.done]
                for k, outcome in enumerate(fresh):
                    self.progress.job_done(outcome, draw=k == len(fresh) - 1)

        start = first
        for num, overrides in enumerate(batch, first):
            message = self._compose_error(overrides)
            if message is None:
                pending.append(overrides)
                continue
            launch_pending()
            outcomes.append(self._record_failure(num, list(overrides), message))
            self.progress.job_done(outcomes[-1])
            pending, start = [], num + 1
        launch_pending()
        return results, outcomes

    def _compose_error(self, overrides: Sequence[str]) -> str | None:
        """None when the job composes (what the launcher will do with it), else the one-line reason."""
        from hydra.errors import HydraException
        from omegaconf.errors import OmegaConfBaseException

        from harness.front.compose_errors import describe

        try:
            self.hydra_context.config_loader.compose(self.config, overrides)
        except (HydraException, OmegaConfBaseException, AssertionError) as e:
            return describe(e, list(overrides))
        return None

    def _job_dir(self, num: int) -> Path:
        """The folder job ``num`` would have had (hydra.sweep.dir / hydra.sweep.subdir)."""
        cfg = copy.deepcopy(self.config)
        with open_dict(cfg.hydra.job):
            cfg.hydra.job.num = num
            cfg.hydra.job.id = f"{cfg.hydra.job.name}_{num}"
        return Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)

    def _record_failure(self, num: int, overrides: list[str], message: str) -> JobOutcome:
        from harness.front.compose_errors import CONFIG_ERROR_CODE, write_failed_job

        run_dir = self._job_dir(num)
        base = copy.deepcopy(self.config)
        with open_dict(base):
            del base["hydra"]
        write_failed_job(run_dir, message, overrides, base)
        self.progress.write(f"kvbench: job {num}: error: ConfigError: {message}")
        return JobOutcome(num, str(run_dir), "error", CONFIG_ERROR_CODE)

    def _outcome(self, num: int, ret: JobReturn) -> JobOutcome:
        run_dir = str(OmegaConf.select(ret.hydra_cfg, "hydra.runtime.output_dir", default="")) if ret.hydra_cfg else ""
        if ret.status == JobStatus.COMPLETED and isinstance(ret.return_value, dict):
            return outcome_of(num, run_dir, ret.return_value)
        exc = ret._return_value  # a failed job's exception (the public property re-raises it)
        self.progress.write(f"kvbench: job {num}: error: {type(exc).__name__}: {exc}")
        return JobOutcome(num, run_dir, "error", 1)

    @staticmethod
    def _finish(outcomes: list[JobOutcome]) -> None:
        code = max((o.code for o in outcomes), default=0)
        print(f"kvbench: {summary_line(outcomes)}", file=sys.stderr if code else sys.stdout)
        if code:
            # Hydra discards a sweeper's return value; the exit code is the one way to say it.
            raise SystemExit(code)
