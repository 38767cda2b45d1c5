"""``python -m harness.replay RUN_DIR``: the saved config alone reproduces the run's digests."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd

from harness.front.job import run_job
from tests.conftest import REPO_ROOT
from tests.helpers.harness_proc import env

SMALL = ["+impl=paged_torch", "model=tiny-llama", "device=cpu", "max_seq_len=48", "workload=uniform", "batch=3",
         "workload.prompt_len=8", "workload.output_len=4", "scenario.warmup=0", "seed=5"]


def replay(*args: str, **extra_env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.front.replay", *args], cwd=REPO_ROOT, env=env(**extra_env),
                          capture_output=True, text=True, timeout=300)


def test_a_replay_reproduces_the_digests_and_names_what_changed(compose, tmp_path, monkeypatch):
    original, replayed = tmp_path / "run", tmp_path / "replay"
    # The original ran from a dirty checkout of another commit (whatever state this checkout is in).
    monkeypatch.setenv("KVBENCH_GIT_SHA", "fedc9876")
    monkeypatch.setenv("KVBENCH_GIT_DIRTY", "1")
    rows, code = run_job(compose(SMALL), original)
    monkeypatch.delenv("KVBENCH_GIT_SHA")
    monkeypatch.delenv("KVBENCH_GIT_DIRTY")
    assert code == 0
    # Another commit of the code: the one fingerprint field that differs.
    p = replay(str(original), "--out", str(replayed), KVBENCH_GIT_SHA="0123abcd", KVBENCH_GIT_DIRTY="0")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "workload digest same, output digest same" in p.stdout
    before, after = rows[0], pd.read_parquet(replayed / "rows.parquet").iloc[0]
    assert after.status == "ok" and after.seed == 5 and after.job_id == before["job_id"]
    assert (after.workload_digest, after.output_digest) == (before["workload_digest"], before["output_digest"])
    assert after.replay_of.endswith("run") and pd.isna(before.get("replay_of"))
    changed = dict(part.split(": ", 1) for part in after.fingerprint_diff.split("; "))
    assert set(changed) == {"git_sha", "git_dirty"} and changed["git_sha"].endswith("-> 0123abcd")


def test_a_folder_without_a_config_is_a_one_line_error(tmp_path):
    p = replay(str(tmp_path), "--out", str(tmp_path / "out"))
    assert p.returncode == 2 and "has no config.yaml" in p.stderr and "Traceback" not in p.stderr
