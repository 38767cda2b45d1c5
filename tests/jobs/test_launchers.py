"""Sweeps on Hydra's launchers: joblib (parallel local jobs) and submitit (SLURM; submitit_local here).

A small capacity sweep runs through each real plugin; every job writes its rows once, a
job whose value does not compose gets its error row, and the others still run.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pytest

from kvbench.harness.job.gpu_slots import claim_gpu
from tests.conftest import REPO_ROOT

SWEEP = ["-m", "scenario=capacity", "model=tiny-llama", "max_seq_len=256", "scenario.concurrency_points=[1,2]"]


def harness(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=300, env=env)


def job_rows(sweep_dir, jobs: int) -> list[pd.DataFrame]:
    assert sorted(p.name for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith(".")) == \
        sorted(str(i) for i in range(jobs))
    return [pd.read_csv(sweep_dir / str(i) / "rows.csv") for i in range(jobs)]


@pytest.mark.slow
def test_joblib_runs_jobs_in_parallel_and_writes_every_row_once(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    p = harness(*SWEEP, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "+impl=paged_torch,contiguous",
                "batch=2,4", f"hydra.sweep.dir={tmp_path}")
    assert p.returncode == 0, p.stderr
    rows = job_rows(tmp_path, 4)
    assert [len(r) for r in rows] == [1, 1, 1, 1] and all((r.status == "ok").all() for r in rows)
    got = sorted((r.impl[0], int(r.batch[0])) for r in rows)
    assert got == [("contiguous", 2), ("contiguous", 4), ("paged_torch", 2), ("paged_torch", 4)]
    assert "kvbench: 4 jobs: 4 ok" in p.stdout


@pytest.mark.slow
def test_submitit_local_runs_the_jobs_that_compose(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    p = harness(*SWEEP, "hydra/launcher=submitit_local", "+impl=paged_torch", "batch=2,abc,4",
                f"hydra.sweep.dir={tmp_path}")
    assert p.returncode == 2, p.stderr
    rows = job_rows(tmp_path, 3)
    assert [len(r) for r in rows] == [1, 1, 1]
    assert [r.status[0] for r in rows] == ["ok", "error", "ok"]
    assert [str(r.batch[0]) for r in rows] == ["2", "abc", "4"]
    assert f"3 jobs: 2 ok, 1 error: {tmp_path / '1'}" in p.stderr


def test_launcher_presets_compose():
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from hydra import compose, initialize_config_dir

    import kvbench.harness.front.app  # noqa: F401  (registers the schema and the resolvers, as the CLI does)

    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base=None):
        slurm = compose("config", overrides=["hydra/launcher=slurm", "hydra.launcher.partition=gpu"],
                        return_hydra_config=True).hydra.launcher
        gpus = compose("config", overrides=["hydra/launcher=joblib_gpus"], return_hydra_config=True).hydra.launcher
    assert slurm._target_.endswith("SlurmLauncher")
    assert (slurm.partition, slurm.gpus_per_task, slurm.tasks_per_node, slurm.timeout_min) == ("gpu", 1, 1, 60)
    assert gpus._target_.endswith("JoblibLauncher") and gpus.n_jobs >= 1


def test_each_worker_claims_a_gpu_of_its_own(tmp_path):
    held = subprocess.Popen([sys.executable, "-c",
                             "import sys, time; from kvbench.harness.job.gpu_slots import claim_gpu; from pathlib import Path;"
                             f"print(claim_gpu(['0', '1'], Path({str(tmp_path)!r})), flush=True); time.sleep(30)"],
                            cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    try:
        assert held.stdout.readline().strip() == "0"  # the other worker holds GPU 0 ...
        assert claim_gpu(["0", "1"], tmp_path) == "1"  # ... so this one gets GPU 1
        assert claim_gpu(["0", "1"], tmp_path) is None  # and a third finds none free
    finally:
        held.kill()
        held.wait()
    assert claim_gpu(["0", "1"], tmp_path) == "0"  # a worker's GPU is free again once it is gone


def test_summary_line_counts_statuses_and_names_failing_folders():
    from kvbench.harness.front.sweeper import JobOutcome, summary_line

    outcomes = [JobOutcome(0, "r/0", "ok", 0), JobOutcome(1, "r/1", "error", 2), JobOutcome(2, "r/2", "oom", 1),
                *(JobOutcome(i, f"r/{i}", "ok", 0) for i in range(3, 12))]
    assert summary_line(outcomes) == "12 jobs: 10 ok, 1 error, 1 oom: r/1, r/2"
    many = [JobOutcome(i, f"r/{i}", "error", 1) for i in range(7)]
    assert summary_line(many).endswith("r/0, r/1, r/2, r/3, r/4 and 2 more")
