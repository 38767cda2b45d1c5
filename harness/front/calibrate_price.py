"""A user's run priced on the simulated clock under chosen engine constants, for ``kvbench calibrate``.

Each run is priced as the clock check prices a published point (harness/front/clock_check_price.py: ``overrides``
writes the command line, ``metric_value`` reads each figure from the run's requests table, as vLLM's benchmark
computes it), with the engine named and the constants being fitted set on the command line
(``engine.frontend_ms=...``: the last of two values given for a key wins). One simulation gives every figure of a
file, so a calibration costs one kvbench run (a subprocess, about 2-3 s) per file and set of constants, not one per
figure; runs go in parallel, one per core, and each (file, constants) is priced once.

Beyond the clock check's command line:

- ``engine.offline=false`` always: ``vllm bench serve`` talks to a server, so every request pays the front-end cost
  (the clock check's offline points are ``vllm bench throughput`` and TensorRT-LLM's offline runs, which do not);
- every prompt sent at once without a client cap (``--request-rate inf``, no ``--max-concurrency``) runs at most
  vLLM's default ``max_num_seqs`` (``ONLINE_BATCH``) at a time, on at most ``cap`` requests, not the clock check's
  whole-KV-cache batch of TensorRT-LLM's offline runs;
- vLLM's gamma arrivals (``--burstiness``) where the file has them (harness/front/calibrate_points.py);
- a client cap with a finite rate (``--request-rate R --max-concurrency C``: ``arrival.max_concurrency=C``), where
  the clock check's command line caps only an infinite rate's client.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Mapping, Sequence

from kvbench.harness.errors import ConfigError
from kvbench.harness.front.calibrate_points import Run
from kvbench.harness.front.clock_check_price import (DEFAULT_CAP, ONLINE_BATCH, REPO, is_offline, metric_value,
                                                     overrides, read_requests, run_args)

# The constants a calibration fits, in the order of a constants vector; the engine's others stay the base profile's.
FITTED = ("frontend_ms", "step_overhead_us", "seq_overhead_us")
DECIMALS = 3  # constants are rounded to this before they are priced: the profile written holds what was priced


def fmt(value: float) -> str:
    """A constant as the command line and the profile write it (``DECIMALS`` places, no trailing zeros)."""
    text = f"{value:.{DECIMALS}f}".rstrip("0").rstrip(".")
    return text if text not in ("", "-0") else "0"


def command(run: Run, engine: str, constants: Mapping[str, float], cap: int = DEFAULT_CAP,
            repo: Path = REPO) -> list[str]:
    """The overrides that price ``run`` under ``engine`` with ``constants`` (FITTED keys) set."""
    p = run.point
    args = overrides(p, cap, repo)
    if is_offline(p):  # vLLM's server, every prompt at once: its max_num_seqs at a time (module docstring)
        args += [f"batch={ONLINE_BATCH}", f"workload.num_requests={min(p.num_requests, cap)}"]
    args += [*run.arrival, f"engine={engine}", "engine.offline=false"]
    return args + [f"engine.{key}={fmt(constants[key])}" for key in FITTED]


def simulate(run: Run, engine: str, constants: Mapping[str, float], cap: int = DEFAULT_CAP, repo: Path = REPO,
             timeout_s: float = 300) -> dict[str, float]:
    """Every figure of ``run`` (metric -> value) priced under ``constants``; a run kvbench refuses names the file."""
    args = command(run, engine, constants, cap, repo)
    with tempfile.TemporaryDirectory(prefix="kvbench_calibrate_") as tmp:
        try:
            _, error = run_args(args, Path(tmp) / "run", repo, timeout_s)
        except subprocess.TimeoutExpired:
            error = f"it ran over {timeout_s:g} s (a smaller --cap simulates fewer requests)"
        if error:
            raise ConfigError(f"{run.path}: kvbench could not price it: {error} "
                              f"(python -m harness {' '.join(args)})")
        reqs = read_requests(Path(tmp) / "run" / "requests.csv")
    try:
        return {p.metric: metric_value(p.metric, reqs) for p in run.points}
    except ValueError as e:
        raise ConfigError(f"{run.path}: {e} (python -m harness {' '.join(args)})") from None


class Pricer:
    """The simulated figures of a calibration's points under any constants vector (FITTED order), each run
    priced once per vector and in parallel (``workers`` subprocesses at a time)."""

    def __init__(self, runs: Sequence[Run], engine: str, cap: int = DEFAULT_CAP, repo: Path = REPO,
                 workers: int | None = None) -> None:
        self.runs, self.engine, self.cap, self.repo = list(runs), engine, cap, repo
        self.workers = workers or max(1, os.cpu_count() or 1)
        self.points = [(i, p) for i, run in enumerate(self.runs) for p in run.points]
        self._memo: dict[tuple[int, tuple[float, ...]], dict[str, float]] = {}
        self.simulations = 0  # kvbench runs so far: the calibration's cost

    @staticmethod
    def key(theta: Sequence[float]) -> tuple[float, ...]:
        return tuple(round(float(v), DECIMALS) for v in theta)

    def _price(self, job: tuple[int, tuple[float, ...]]) -> dict[str, float]:
        run, theta = job
        return simulate(self.runs[run], self.engine, dict(zip(FITTED, theta)), self.cap, self.repo)

    def values(self, thetas: Sequence[Sequence[float]], which: Sequence[int]) -> list[list[float]]:
        """For each vector of ``thetas``, the simulated figure of each point numbered in ``which``."""
        keys = [self.key(t) for t in thetas]
        jobs = sorted({(self.points[j][0], k) for k in keys for j in which} - self._memo.keys())
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            for job, figures in zip(jobs, pool.map(self._price, jobs)):
                self._memo[job] = figures
        self.simulations += len(jobs)
        return [[self._memo[(self.points[j][0], k)][self.points[j][1].metric] for j in which] for k in keys]
