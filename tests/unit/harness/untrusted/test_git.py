"""Every git call kvbench makes leaves the checkout's .git as it was: no index refresh, no lock."""

from __future__ import annotations

import os
import subprocess
import time

from kvbench.harness.measure.fingerprint import code_version


def _repo(tmp_path):
    run = lambda *a: subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True)  # noqa: E731
    run("init", "-q")
    (tmp_path / "f.py").write_text("x = 1\n")
    run("add", "f.py")
    run("-c", "user.email=k@b", "-c", "user.name=k", "commit", "-qm", "x")
    return run


def test_code_version_does_not_rewrite_the_index(tmp_path):
    """A touched file makes plain `git status` rewrite .git/index (under index.lock); kvbench's does not."""
    run = _repo(tmp_path)
    index = tmp_path / ".git" / "index"
    later = time.time() + 5
    os.utime(tmp_path / "f.py", (later, later))  # same content, newer stat: git would refresh its entry
    before = index.stat().st_mtime_ns
    assert code_version(tmp_path) == (run("rev-parse", "HEAD").stdout.decode().strip(), False)
    assert index.stat().st_mtime_ns == before and not (tmp_path / ".git" / "index.lock").exists()
    run("status", "--porcelain")  # the check can fail: git's own default refreshes it
    assert index.stat().st_mtime_ns != before
