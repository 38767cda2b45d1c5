"""A run under an artificial CPU hog is flagged, and the report keeps it, marked (issue 43: drawn, never dropped)."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import time

import pandas as pd

from tests.conftest import REPO_ROOT


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_a_run_under_a_cpu_hog_is_flagged_and_kept_marked_in_the_report(tmp_path):
    hogs = [mp.get_context("fork").Process(target=_spin, args=(60,)) for _ in range(2 * (os.cpu_count() or 1))]
    for h in hogs:
        h.start()
    try:
        run = tmp_path / "run"
        p = subprocess.run([sys.executable, "-m", "harness", "+impl=paged_torch", "model=tiny-llama", "batch=4",
                            "workload.num_requests=4", "workload.prompt_len=16", "workload.output_len=8",
                            "max_seq_len=64", "scenario.warmup=0", f"hydra.run.dir={run}", "hydra/job_logging=disabled"],
                           cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    finally:
        for h in hogs:
            h.kill()
    assert p.returncode == 0, p.stderr[-2000:]
    row = pd.read_parquet(run / "rows.parquet").iloc[0]
    assert row.status == "ok" and bool(row.contended) and "contended: its threads waited for a free core" in row.notes
    assert row.run_queue_wait_frac > 0.25 and row.cpu_util < 0.75 * max(1, min(os.cpu_count() or 1, 2))
    out = tmp_path / "report"
    from kvbench.harness.report import build_report
    from kvbench.harness.report.caveats import FLAG

    build_report([tmp_path], out, "test")
    text = (out / "REPORT.md").read_text()
    assert "## Rows measured under contention" in text
    # its one decode point is a table row (a one-point panel is no figure), its impl marked as flagged
    assert f"paged_torch{FLAG}" in text
