"""A run under an artificial CPU hog is flagged, and the report leaves it out of its figures."""

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


def test_a_run_under_a_cpu_hog_is_flagged_and_left_out_of_the_figures(tmp_path):
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
    from harness.report import build_report

    report = build_report([tmp_path], out, "test")
    assert "## Rows measured under contention" in (out / "REPORT.md").read_text()
    assert "decode_throughput" not in report.figures  # its only decode row was contended
    drawn = build_report([tmp_path], tmp_path / "report2", "test", include_contended=True)
    assert "decode_throughput" in drawn.figures
