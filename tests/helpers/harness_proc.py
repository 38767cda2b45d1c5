"""The CLI in a subprocess that a test can stop mid-run (with tests/helpers/gated_kernel.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from tests.conftest import REPO_ROOT
from tests.helpers.gated_kernel import NAME as GATED_KERNEL

# A small decode job on CPU: every impl of it runs in well under a second.
TINY = ["model=tiny-llama", "device=cpu", "dtype=float32", "max_seq_len=32", "workload=fixed",
        "workload.prompt_len=4", "workload.output_len=3", "scenario.warmup=0", "hydra/job_logging=disabled",
        "hydra/hydra_logging=disabled"]
# The gated impl by overrides alone (no config file): a paged cache over tests/helpers/gated_kernel.py.
GATED = ["+impl=paged_torch", "impl.name=gated", f"impl.kernel={GATED_KERNEL}"]


def env(**extra: str) -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), **extra}


def _default_sigint() -> None:
    """A run a test interrupts gets Ctrl-C as a terminal gives it. A suite started in the background
    by a non-interactive shell (``make test &``) has SIGINT ignored, and a child would inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(*args: str, **extra_env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "harness", *args], cwd=REPO_ROOT, env=env(**extra_env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)


def run(*args: str, **extra_env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=REPO_ROOT, env=env(**extra_env),
                          capture_output=True, text=True, timeout=300)


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until ``path`` exists; fails early (with the run's output) if the run ends first."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"run ended (rc {proc.returncode}) before {path.name} appeared:\n{out}\n{err[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{path} did not appear within {timeout} s")
        time.sleep(0.05)


def rows(run_dir: Path) -> pd.DataFrame:
    return pd.read_parquet(run_dir / "rows.parquet")
