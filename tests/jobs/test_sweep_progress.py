"""A sweep says how far it is as each job ends, in lines a log file keeps readable."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.conftest import REPO_ROOT

SWEEP = ["-m", "+impl=paged_torch", "scenario=capacity", "model=tiny-llama", "max_seq_len=256",
         "scenario.concurrency_points=[1,2]", "hydra/job_logging=disabled"]
PROGRESS = re.compile(r"kvbench: \[[#-]{20}\] (\d+)/(\d+) jobs done \(job (\d+): (\w+)\)")


def sweep(*args: str) -> subprocess.CompletedProcess:
    """stdout and stderr in one pipe, unbuffered: the order a terminal or a log shows them in."""
    return subprocess.run([sys.executable, "-m", "harness", *SWEEP, *args], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO_ROOT)})


def test_each_job_gets_a_progress_line_as_it_ends_not_when_the_sweep_does(tmp_path):
    p = sweep("batch=1,abc,2,3", f"hydra.sweep.dir={tmp_path}")
    assert p.returncode == 2, p.stdout
    lines = p.stdout.splitlines()
    assert "\r" not in p.stdout  # a pipe gets no carriage returns (no bar redrawn in place)
    progress = [(i, PROGRESS.match(ln)) for i, ln in enumerate(lines) if PROGRESS.match(ln)]
    assert [m.groups() for _, m in progress] == [("1", "4", "0", "ok"), ("2", "4", "1", "error"),
                                                 ("3", "4", "2", "ok"), ("4", "4", "3", "ok")]
    # jobs 2 and 3 are one launch of Hydra's basic launcher: job 2's line comes before job 3's table
    job3_results = lines.index(f"results: {tmp_path / '3'}")
    assert progress[2][0] < job3_results < progress[3][0]
    assert "eta " in lines[progress[0][0]] and "done in " in lines[progress[3][0]]
    assert lines[-1] == f"kvbench: 4 jobs: 3 ok, 1 error: {tmp_path / '1'}"  # the summary stays last


def test_progress_false_turns_the_lines_off(tmp_path):
    p = sweep("batch=1,2", "progress=false", f"hydra.sweep.dir={tmp_path}")
    assert p.returncode == 0, p.stdout
    assert not PROGRESS.search(p.stdout) and "kvbench: 2 jobs: 2 ok" in p.stdout
