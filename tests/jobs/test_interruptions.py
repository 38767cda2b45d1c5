"""A run stopped part-way keeps what finished: rows as each impl ends, SIGINT/SIGTERM rows, kill -9, resume."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from kvbench.harness.front.groups import impl_names
from kvbench.harness.front.job import run_job
from tests.helpers.harness_proc import GATED, GATED_KERNEL, TINY, rows, run, start, wait_for

BUILTIN = impl_names()  # an every-impl run's order: conf/impl/, sorted


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_writes_an_interrupted_row_and_exits_without_a_traceback(tmp_path, sig):
    gate, out = tmp_path / "gate", tmp_path / "run"
    gate.touch()
    proc = start(*GATED, *TINY, "batch=2", f"hydra.run.dir={out}", KVB_GATE=str(gate))
    wait_for(Path(f"{gate}.reached"), proc)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert sig.name in stderr and str(out) in stderr
    row = rows(out).iloc[0]
    assert row.impl == "gated" and row.status == "interrupted" and sig.name in row.error and row.job_id


def test_kill_9_keeps_finished_impls_rows_and_resume_runs_only_the_rest(tmp_path):
    (tmp_path / "conf" / "impl").mkdir(parents=True)
    (tmp_path / "conf" / "impl" / "gated.yaml").write_text(f"name: gated\ncache: paged\nkernel: {GATED_KERNEL}\n")
    gate, out = tmp_path / "gate", tmp_path / "run"
    gate.touch()
    args = [f"hydra.searchpath=[file://{tmp_path / 'conf'}]", *TINY, "batch=2", f"hydra.run.dir={out}"]
    proc = start(*args, KVB_GATE=str(gate))  # every impl; the gated one comes last and waits
    wait_for(Path(f"{gate}.reached"), proc)
    proc.kill()
    proc.wait()
    first = rows(out)
    assert list(first.impl) == BUILTIN and set(first.status) == {"ok"}
    tokens = [json.loads(line) for line in (out / "tokens.jsonl").read_text().splitlines()]
    assert sorted({t["impl"] for t in tokens}) == BUILTIN

    p = run(*args, "resume=true")  # no gate now
    assert p.returncode == 0, p.stderr[-3000:]
    again = rows(out).set_index("impl")
    assert list(again.index) == [*BUILTIN, "gated"] and set(again.status) == {"ok"}
    assert (again.loc[BUILTIN, "wall_s"] == first.set_index("impl").wall_s).all()  # kept, not re-run
    assert again.output_digest.nunique() == 1 and again.job_id.nunique() == 1
    tokens = [json.loads(line) for line in (out / "tokens.jsonl").read_text().splitlines()]
    assert sorted(t["impl"] for t in tokens) == sorted([*BUILTIN, "gated"] * 2)  # two requests each, once


def test_a_killed_sweep_resumed_runs_every_job_exactly_once(tmp_path):
    gate, sweep = tmp_path / "gate", tmp_path / "sweep"
    gate.touch()
    args = ["-m", *GATED, *TINY, "batch=1,2,3,4", f"hydra.sweep.dir={sweep}", "resume=true"]
    proc = start(*args, KVB_GATE=str(gate), KVB_GATE_BATCH="3")  # job 2 (batch=3) waits at the gate
    wait_for(Path(f"{gate}.reached"), proc)
    proc.kill()
    proc.wait()
    assert [(sweep / str(i) / "rows.parquet").exists() for i in range(4)] == [True, True, False, False]
    finished = {i: (sweep / str(i) / "rows.parquet").stat().st_mtime_ns for i in (0, 1)}

    p = run(*args)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.count("nothing to run") == 2
    assert {i: (sweep / str(i) / "rows.parquet").stat().st_mtime_ns for i in (0, 1)} == finished
    jobs = [rows(sweep / str(i)) for i in range(4)]
    assert [len(r) for r in jobs] == [1, 1, 1, 1]
    assert [r.status[0] for r in jobs] == ["ok"] * 4 and [r.batch[0] for r in jobs] == [1, 2, 3, 4]
    assert len({r.job_id[0] for r in jobs}) == 4


CAPACITY = ["scenario=capacity", "model=tiny-llama", "device=cpu", "workload.num_requests=4",
            "scenario.concurrency_points=[1,2]"]


@pytest.mark.parametrize("status, reruns", [("error", True), ("interrupted", True), ("oom", False), ("ok", False)])
def test_resume_reruns_error_and_interrupted_rows_only(compose, tmp_path, status, reruns):
    first, _ = run_job(compose(["+impl=paged_torch", *CAPACITY]), tmp_path)
    df = rows(tmp_path)
    df["status"] = status
    df.to_parquet(tmp_path / "rows.parquet")  # as an earlier attempt that ended so had left it
    again, code = run_job(compose(["+impl=paged_torch", *CAPACITY, "resume=true"]), tmp_path)
    assert [r["status"] for r in again] == ["ok" if reruns else status]
    assert (again[0]["wall_s"] != first[0]["wall_s"]) == reruns
    assert list(rows(tmp_path).status) == [again[0]["status"]]


def test_resume_reruns_only_the_impls_that_need_it_and_keeps_the_side_tables(compose, tmp_path):
    first, _ = run_job(compose(CAPACITY), tmp_path)  # every impl, and the job's points table
    points = (tmp_path / "points.csv").read_text()
    df = rows(tmp_path)
    df.loc[df.impl == "paged_cuda", "status"] = "error"
    df.to_parquet(tmp_path / "rows.parquet")
    again, code = run_job(compose([*CAPACITY, "resume=true"]), tmp_path)
    assert code == 0 and [r["impl"] for r in again] == BUILTIN and {r["status"] for r in again} == {"ok"}
    rerun = [a["impl"] for a, b in zip(again, first) if a["wall_s"] != b["wall_s"]]
    assert rerun == ["paged_cuda"]
    assert (tmp_path / "points.csv").read_text() == points
    assert list(rows(tmp_path).impl) == BUILTIN


def test_ctrl_c_before_the_run_starts_is_one_line(tmp_path):
    """SIGINT while Python is still importing and composing: exit 130, one line, no traceback."""
    import time

    import subprocess

    proc = start("+impl=paged_torch", *TINY, f"hydra.run.dir={tmp_path / 'run'}")
    time.sleep(0.6)  # inside the imports (hydra and torch take over a second to load)
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=0.5)  # caught: one line and os._exit, milliseconds
    except subprocess.TimeoutExpired:
        # Still running: on a loaded machine the interrupt once landed inside a library's import that swallows
        # it (the run went on and exited 0, one suite run in four). A user presses Ctrl-C again; the second is
        # caught before the run or by the run's own handler, 130 and one line either way.
        proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1


SWALLOWING_IMPORT = """
import os, signal, sys, time
import kvbench.harness.front.preflight as preflight
checked = preflight.check_command_line
def swallowing(argv):
    try:  # what a library import with a bare except does to a Ctrl-C that lands in it
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)
    except BaseException:
        pass
    return checked(argv)
preflight.check_command_line = swallowing
sys.argv[0] = "kvbench"
from kvbench.harness.__main__ import cli
cli()
"""


def test_a_ctrl_c_a_library_swallowed_before_the_run_still_stops_it(tmp_path):
    """The Ctrl-C is remembered: swallowed during the imports, it is raised again at the last point before the run
    (without that, this run went on and exited 0), one line and 130 as for any Ctrl-C before a run."""
    import subprocess
    import sys

    from tests.helpers.harness_proc import _default_sigint, env

    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", SWALLOWING_IMPORT, "+impl=paged_torch", *TINY,
                           f"hydra.run.dir={out}"], capture_output=True, text=True, timeout=120, env=env(),
                          preexec_fn=_default_sigint)
    assert proc.returncode == 130 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == ["kvbench: interrupted before any run started; nothing was written"]
    assert not (out / "rows.csv").exists()
