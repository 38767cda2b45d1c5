"""Hydra's basic sweep, made to survive a job that does not compose.

Hydra's ``BasicSweeper`` composes every job of a batch before launching it and stops the
whole sweep on the first that fails (``batch=1,abc,2``: a type error; ``model=a,nope``:
an unknown option). This one composes each job the same way, gives a failing job its
error row (in the folder the job would have had) and launches the others through the
configured launcher (basic, joblib, submitit), each under its own job number. At the end
it prints one line (``3 jobs: 2 ok, 1 error: runs/sweeps/.../1``) and exits non-zero when any
job failed. On a terminal, tqdm's bar on stderr moves on as each job ends (``SweepProgress``:
job n of N, the counts so far, the ETA and rate); a pipe or a log file gets no bar.
Registered for Hydra as hydra_plugins/kvbench_sweeper (``hydra/sweeper=kvbench``).
"""

from __future__ import annotations

import copy
import itertools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from kvbench.harness.front.composed_once import ComposedOnce
from kvbench.harness.front.sweep_outcome import JobOutcome, job_outcome_value, summary_line  # noqa: F401 (the sweep's names)
from kvbench.harness.front.sweep_progress import SweepProgress
from kvbench.harness.front.portable import portable
from kvbench.harness.results import atomic_write

# conf/sweep/ files are named for the device they are the default sweep of (make sweep)
DEVICE_PREFIXES = ("cpu_", "gpu_")


def sweep_folder(sweep: str) -> str:
    """The results folder of the conf/sweep/ file ``sweep``: its name less the device prefix (cpu_kernel: kernel)."""
    return next((sweep.removeprefix(p) for p in DEVICE_PREFIXES if sweep.startswith(p)), sweep)


def register_sweep_folder_resolver() -> None:
    """``${kvbench_sweep_folder:NAME}`` in configs (conf/hydra/sweep_results.yaml): ``sweep_folder(NAME)``."""
    if not OmegaConf.has_resolver("kvbench_sweep_folder"):
        OmegaConf.register_new_resolver("kvbench_sweep_folder", sweep_folder)


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

        from kvbench.harness.front.compose_errors import describe

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
        from kvbench.harness.front.compose_errors import CONFIG_ERROR_CODE, write_failed_job

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
