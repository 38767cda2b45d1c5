"""A sweep says how far it is as each job ends: tqdm's bar on a terminal, nothing in a pipe or a log."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios

from tests.conftest import REPO_ROOT

SWEEP = ["-m", "+impl=paged_torch", "scenario=capacity", "model=tiny-llama", "max_seq_len=256",
         "scenario.concurrency_points=[1,2]", "hydra/job_logging=disabled"]
# each state the bar was drawn in: jobs done of all, the counts so far, the job that just ended, the ETA
BAR = re.compile(r"kvbench: \[[^\]]{20}\] (\d+)/(\d+) jobs, (\d+) ok, (\d+) error \(job (\d+): (\w+)\) "
                 r"\[[\d:]+<([\d:?]+), ")


def env() -> dict:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO_ROOT)}


def sweep(*args: str) -> subprocess.CompletedProcess:
    """stdout and stderr in one pipe, unbuffered: the order a log shows them in."""
    return subprocess.run([sys.executable, "-m", "harness", *SWEEP, *args], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300, env=env())


def sweep_on_a_terminal(*args: str) -> tuple[int, str]:
    """stdout and stderr on one pseudo-terminal (200 columns): what a terminal shows, in its order."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "harness", *SWEEP, *args], cwd=REPO_ROOT, stdin=subprocess.DEVNULL,
                            stdout=slave, stderr=slave, env=env())
    os.close(slave)
    chunks = []
    try:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
    return proc.wait(timeout=300), b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")


def test_each_job_moves_the_bar_as_it_ends_not_when_the_sweep_does(tmp_path):
    code, shown = sweep_on_a_terminal("batch=1,abc,2,3", f"hydra.sweep.dir={tmp_path}")
    assert code == 2, shown
    states = [(m.start(), m.groups()) for m in BAR.finditer(shown)]
    firsts: dict[str, tuple[int, tuple]] = {}
    for at, groups in states:  # the bar is drawn again under each line of the jobs' output
        firsts.setdefault(groups[0], (at, groups))
    assert [g[:6] for _, g in firsts.values()] == [("1", "4", "1", "0", "0", "ok"), ("2", "4", "1", "1", "1", "error"),
                                                   ("3", "4", "2", "1", "2", "ok"), ("4", "4", "3", "1", "3", "ok")]
    # jobs 2 and 3 are one launch of Hydra's basic launcher: job 2's state comes before job 3's table
    job3_results = shown.index(f"results: {tmp_path / '3'}")
    assert firsts["3"][0] < job3_results < firsts["4"][0]
    assert re.fullmatch(r"[\d:]+", firsts["1"][1][6])  # an ETA after the first job
    assert firsts["4"][1][6] == "00:00"
    assert "kvbench: job 1: error: ConfigError" in shown  # the failing job's reason, on a line of its own
    assert shown.rstrip("\n").splitlines()[-1] == f"kvbench: 4 jobs: 3 ok, 1 error: {tmp_path / '1'}"  # summary last


def test_a_pipe_gets_no_bar(tmp_path):
    p = sweep("batch=1,abc,2", f"hydra.sweep.dir={tmp_path}")
    assert p.returncode == 2, p.stdout
    assert "\r" not in p.stdout and not BAR.search(p.stdout) and " jobs, " not in p.stdout
    assert "kvbench: job 1: error: ConfigError" in p.stdout
    assert p.stdout.splitlines()[-1] == f"kvbench: 3 jobs: 2 ok, 1 error: {tmp_path / '1'}"


def test_progress_false_turns_the_bar_off(tmp_path):
    code, shown = sweep_on_a_terminal("batch=1,2", "progress=false", f"hydra.sweep.dir={tmp_path}")
    assert code == 0, shown
    assert not BAR.search(shown) and " jobs, " not in shown and "kvbench: 2 jobs: 2 ok" in shown
