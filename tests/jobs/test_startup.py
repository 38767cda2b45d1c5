"""Start-up: `--help`, `--cfg job` and a config error never import torch (about 1 s of a 0.6 s answer).

Each command runs in a subprocess whose Python path starts with a ``torch`` package that
raises on import, beside the ``version.py`` of a CPU-only build (what resolving
``device=auto`` reads instead of importing torch: kernels/cuda_available.py). A command
that imported torch would end in that ImportError's traceback instead of its answer.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import REPO_ROOT


@pytest.fixture(scope="module")
def no_torch(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("no_torch")
    (folder / "torch").mkdir()
    (folder / "torch" / "__init__.py").write_text('raise ImportError("this command imported torch")\n')
    (folder / "torch" / "version.py").write_text("from typing import Optional\n\n__version__ = '2.13.0+cpu'\n"
                                                 "cuda: Optional[str] = None\nhip: Optional[str] = None\n")
    return folder


def harness_without_torch(no_torch: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(no_torch), str(REPO_ROOT)])}
    return subprocess.run([sys.executable, "-m", "harness", *args, "hydra/job_logging=disabled"], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=120)


def test_the_blocking_package_does_block_torch(no_torch, tmp_path):
    """The checks below can fail: a valid run under the blocking package ends in its ImportError."""
    p = harness_without_torch(no_torch, "+impl=contiguous", "model=tiny-llama", "batch=1", f"hydra.run.dir={tmp_path}")
    assert p.returncode != 0 and "this command imported torch" in p.stderr


@pytest.mark.parametrize("args", [["--help"], ["--cfg", "job"]])
def test_reading_the_config_does_not_import_torch(no_torch, args):
    p = harness_without_torch(no_torch, *args)
    assert p.returncode == 0, p.stderr
    assert "batch" in p.stdout


@pytest.mark.parametrize("override, expected", [
    ("batch=0", "batch=0 must be >= 1"),  # harness/front/validate.py, after Hydra composed the config
    ("dtype=float8", "dtype='float8' is not allowed"),
    ("arrival=poisson", "arrival=poisson needs arrival.rate"),
    ("device.memory_gb=99999", "device.memory_gb=99999 is larger than"),  # needs the device: device=auto is resolved
    ("+impl=nope", "impl=nope is unknown"),  # Hydra cannot compose it (harness/front/preflight.py)
    # the impl's own keys: the cache kinds and the kernel registry are read without torch
    ("+impl=paged_torch impl.kernel=sdpa", "impl.kernel='sdpa' does not fit impl.cache='paged'"),
    ("+impl=contiguous impl.kernel=nope", "impl.kernel='nope' is not allowed"),
    ("+impl=paged_torch impl.reservation=pow2", "impl.reservation='pow2' does not apply"),
    ("scenario=kernel scenario.probe=x", "scenario.probe belongs to"),
    ("cuda_graph=true", "cuda_graph=true needs a CUDA device"),
])
def test_a_config_error_does_not_import_torch(no_torch, tmp_path, override, expected):
    p = harness_without_torch(no_torch, *override.split(), f"hydra.run.dir={tmp_path}")
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().count("\n") == 0 and expected in p.stderr, p.stderr  # one line, no traceback
    row = pd.read_parquet(tmp_path / "rows.parquet").iloc[0]
    assert row.status == "error" and expected in row.error


def test_the_version_file_reads_as_torch_says():
    """What kernels/cuda_available.py reads from torch/version.py is what the installed torch reports."""
    import torch

    from kvbench.kernels.cuda_available import _gpu_backend_built

    assert _gpu_backend_built() is (torch.version.cuda is not None or torch.version.hip is not None)


def test_a_capacity_run_does_not_import_torch(no_torch, tmp_path):
    """scenario=capacity is bookkeeping only: the whole run, its row and its fingerprint, without torch
    (the import is about a second of a few-second run)."""
    p = harness_without_torch(no_torch, "scenario=capacity", "+impl=paged", "model=tiny-llama", "batch=4",
                              "workload.num_requests=8", "device.memory_gb=1", f"hydra.run.dir={tmp_path}")
    assert p.returncode == 0, p.stderr
    row = pd.read_parquet(tmp_path / "rows.parquet").iloc[0]
    assert row.status == "ok" and row.torch_version == "2.13.0+cpu", row.get("error")
