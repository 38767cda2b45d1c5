"""A row measured by older code, or filed under another machine's folder, is flagged stale."""

import subprocess
from pathlib import Path

import pandas as pd

from kvbench.harness.report.stale import code_changes_since, filed_slug, stale_reasons


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def _repo(tmp_path: Path) -> tuple[Path, str, str]:
    repo = tmp_path / "repo"
    (repo / "harness").mkdir(parents=True)
    (repo / "harness" / "a.py").write_text("x = 1\n")
    _git(repo, "init", "-q")
    commit = ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam"]
    _git(repo, "add", "-A")
    _git(repo, *commit, "code")
    old = _git(repo, "rev-parse", "HEAD")
    (repo / "README.md").write_text("docs\n")
    _git(repo, "add", "-A")
    _git(repo, *commit, "docs only")
    docs = _git(repo, "rev-parse", "HEAD")
    (repo / "harness" / "a.py").write_text("x = 2\n")
    _git(repo, *commit, "code again")
    return repo, old, docs


def test_code_changes_since_counts_code_not_docs(tmp_path):
    repo, old, docs = _repo(tmp_path)
    assert code_changes_since(old, repo) == f"code changed since {old[:7]} (1 code files)"
    head = _git(repo, "rev-parse", "HEAD")
    assert code_changes_since(head, repo) is None
    assert "not in this checkout's history" in code_changes_since("0" * 40, repo)
    assert code_changes_since(old, tmp_path / "not-a-repo") is None  # git cannot say: nothing flagged


def test_rows_say_why_they_are_stale(tmp_path):
    repo, old, _ = _repo(tmp_path)
    head = _git(repo, "rev-parse", "HEAD")
    rows = pd.DataFrame([
        {"git_sha": head, "git_dirty": False, "device_slug": "cpu-intel-xeon-2core",
         "run_dir": "results/cpu-intel-xeon-2core/decode/0"},
        {"git_sha": old, "git_dirty": False, "device_slug": "cpu-intel-xeon-2core",
         "run_dir": "results/cpu-intel-xeon-2core/decode/1"},
        {"git_sha": head, "git_dirty": pd.NA, "device_slug": "cpu-amd-epyc-7b13-2core",
         "run_dir": "results/cpu-intel-xeon-2core/decode/2"},
        {"git_sha": head, "git_dirty": True, "device_slug": "x", "run_dir": "runs/2026-12-01/x"},
    ])
    why = stale_reasons(rows, repo).tolist()
    assert why[0] is None
    assert why[1].startswith("code changed since")
    assert why[2] == "measured on cpu-amd-epyc-7b13-2core, filed under cpu-intel-xeon-2core"
    assert why[3] == "measured by uncommitted code"


def test_the_folder_a_row_is_filed_under():
    assert filed_slug("results/nvidia-h200/decode/3") == "nvidia-h200"
    assert filed_slug("runs/results/x") is None  # results/<slug>/<run>: a bare run is not filed under a slug
    assert filed_slug("runs/sweeps/2026/3") is None
