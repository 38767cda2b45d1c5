"""A run folder holds one job: another job is refused, stale files go, a second writer is turned away."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from kvbench.harness.results import atomic_write, write_table
from kvbench.harness.front.job import run_job
from tests.helpers.harness_proc import GATED, TINY, rows, run, start, wait_for

CAPACITY = ["+impl=paged_torch", "scenario=capacity", "model=tiny-llama", "device=cpu", "workload.num_requests=4",
            "scenario.concurrency_points=[1,2]"]


@pytest.mark.parametrize("resume", ["false", "true"])
def test_a_folder_holding_another_job_is_refused(compose, tmp_path, resume):
    first, code = run_job(compose(CAPACITY), tmp_path)
    assert code == 0
    before = (tmp_path / "rows.parquet").read_bytes()
    refused, code = run_job(compose([*CAPACITY, "batch=3", f"resume={resume}"]), tmp_path)
    assert code == 2
    error = refused[0]["error"]
    assert str(tmp_path) in error and "another job" in error and "hydra.run.dir" in error
    assert (tmp_path / "rows.parquet").read_bytes() == before  # untouched
    assert json.loads((tmp_path / "job.json").read_text())["job_id"] == first[0]["job_id"]


def test_a_bad_config_does_not_overwrite_another_jobs_folder(compose, tmp_path):
    run_job(compose(CAPACITY), tmp_path)
    before = (tmp_path / "rows.parquet").read_bytes()
    refused, code = run_job(compose([*CAPACITY, "batch=0"]), tmp_path)
    assert code == 2 and "another job" in refused[0]["error"]
    assert (tmp_path / "rows.parquet").read_bytes() == before


def test_an_earlier_attempts_files_are_removed_before_writing(compose, tmp_path):
    # A folder from before job.json existed: rows, tokens and a steps table of some other run.
    write_table(pd.DataFrame([{"impl": "old", "status": "ok"}]), tmp_path / "rows")
    write_table(pd.DataFrame([{"impl": "old", "step": 0}]), tmp_path / "steps")
    (tmp_path / "tokens.jsonl").write_text('{"impl": "old"}\n')
    new, code = run_job(compose(CAPACITY), tmp_path)  # capacity writes no tokens and no steps
    assert code == 0
    assert not (tmp_path / "tokens.jsonl").exists() and not list(tmp_path.glob("steps.*"))
    assert list(rows(tmp_path).impl) == ["paged_torch"] and (tmp_path / "points.parquet").exists()
    # The same job again (no resume) starts afresh too: its own earlier rows are replaced.
    again, code = run_job(compose(CAPACITY), tmp_path)
    assert code == 0 and len(rows(tmp_path)) == 1 and rows(tmp_path).wall_s[0] == again[0]["wall_s"]
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_second_writer_gets_a_clear_error_and_leaves_the_first_alone(tmp_path):
    gate, out = tmp_path / "gate", tmp_path / "run"
    gate.touch()
    first = start(*GATED, *TINY, "batch=2", f"hydra.run.dir={out}", KVB_GATE=str(gate))
    try:
        wait_for(Path(f"{gate}.reached"), first)
        job = (out / "job.json").read_text()
        second = run(*GATED, *TINY, "batch=2", "seed=1", f"hydra.run.dir={out}")
        assert second.returncode == 2
        assert f"another kvbench run is writing to {out}" in second.stderr and "Traceback" not in second.stderr
        assert (out / "job.json").read_text() == job and not (out / "rows.parquet").exists()
    finally:
        gate.unlink()
    _, stderr = first.communicate(timeout=120)
    assert first.returncode == 0, stderr[-3000:]
    assert list(rows(out).status) == ["ok"] and rows(out).seed[0] == 0


def test_a_failed_write_leaves_the_old_file_whole(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("old\n")

    def half_then_fail(tmp: Path) -> None:
        tmp.write_text("ne")
        raise OSError("disk full")

    with pytest.raises(OSError):
        atomic_write(path, half_then_fail)
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["rows.csv"]


# ---- a sweep's jobs find their folders by identity; a refused run leaves the folder as it was ---------

def _sweep(folder: Path, batches: str) -> None:
    p = run("-m", *CAPACITY, f"batch={batches}", "resume=true", f"hydra.sweep.dir={folder}",
            "hydra/job_logging=disabled")
    assert p.returncode == 0, p.stderr[-2000:]


def _folders(sweep: Path) -> dict[str, tuple[int, str]]:
    """folder name -> (the batch its rows measured, the batch its .hydra/overrides.yaml names)."""
    out = {}
    for job in sorted(sweep.glob("*/job.json")):
        folder = job.parent
        batches = set(pd.read_csv(folder / "rows.csv")["batch"])
        assert len(batches) == 1
        named = [o for o in (folder / ".hydra" / "overrides.yaml").read_text().split() if o.startswith("batch=")]
        out[folder.name] = (batches.pop(), named[0].removeprefix("batch="))
    return out


@pytest.mark.parametrize("first, then, runs", [
    ("1,2,4", "4,2,1,8", {8}),  # reordered and extended: the case (5 of 8 jobs failed before)
    ("1,2,4", "2,1", set()),  # reordered and narrowed: nothing to run
    ("1,2", "8,1,16,2", {8, 16}),  # new values first: folder 0 holds batch=1, so batch=8 goes elsewhere
])
def test_a_changed_sweep_finds_each_jobs_folder_by_identity(tmp_path, first, then, runs):
    sweep = tmp_path / "sweep"
    _sweep(sweep, first)
    before = {name: (sweep / name / "rows.parquet").read_bytes() for name in _folders(sweep)}
    _sweep(sweep, then)
    folders = _folders(sweep)
    # One identity, one folder; each folder holds the job its record names; every value has its folder.
    ids = [json.loads((sweep / n / "job.json").read_text())["job_id"] for n in folders]
    assert len(ids) == len(set(ids))
    assert all(str(measured) == named for measured, named in folders.values())
    assert sorted(m for m, _ in folders.values()) == sorted({int(b) for b in f"{first},{then}".split(",")})
    # The finished jobs were kept as they were (resumed, not rerun); only the new values ran.
    assert all((sweep / name / "rows.parquet").read_bytes() == data for name, data in before.items())
    assert {m for n, (m, _) in folders.items() if n not in before} == runs


def test_a_refused_run_leaves_hydras_record_of_the_folder_as_it_was(tmp_path):
    p = run(*CAPACITY, f"hydra.run.dir={tmp_path}", "hydra/job_logging=disabled")
    assert p.returncode == 0, p.stderr[-2000:]
    record = {f.name: f.read_bytes() for f in (tmp_path / ".hydra").iterdir()}
    assert set(record) == {"config.yaml", "hydra.yaml", "overrides.yaml"}
    p = run(*CAPACITY, "batch=3", f"hydra.run.dir={tmp_path}", "hydra/job_logging=disabled")
    assert p.returncode == 2 and "another job" in p.stderr
    assert {f.name: f.read_bytes() for f in (tmp_path / ".hydra").iterdir()} == record


# ---- numbers belong to the machine that made them -----------------------------------------------------

@pytest.mark.parametrize("field, value", [("cpu_name", "AMD EPYC 7B13"), ("cpu_count", 64), ("torch_version", "2.0.0"),
                                          ("gpu_name", "NVIDIA H200"), (None, None)])
def test_resume_never_keeps_another_machines_rows(compose, tmp_path, capsys, field, value):
    first, code = run_job(compose(CAPACITY), tmp_path)
    assert code == 0
    env = tmp_path / "env.json"
    if field is None:
        env.unlink()  # no record of the machine: not this machine's either
    else:
        env.write_text(json.dumps({**json.loads(env.read_text()), field: value}))
    again, code = run_job(compose([*CAPACITY, "resume=true"]), tmp_path)
    out = capsys.readouterr().out
    assert code == 0 and "measured on another machine" in out and (field or "env.json") in out
    assert not any(r.get("_kept") for r in again) and again[0]["wall_s"] != first[0]["wall_s"]  # measured anew
    assert json.loads(env.read_text())["cpu_name"] == first[0]["cpu_name"]  # and recorded as this machine's


def test_resume_on_the_same_machine_keeps_the_rows_and_says_so(compose, tmp_path, capsys):
    from kvbench.harness.front.sweeper import JobOutcome, job_outcome_value, summary_line

    first, _ = run_job(compose(CAPACITY), tmp_path)
    again, code = run_job(compose([*CAPACITY, "resume=true"]), tmp_path)
    assert code == 0 and all(r["_kept"] for r in again) and again[0]["wall_s"] == first[0]["wall_s"]
    assert job_outcome_value(tmp_path, again, 0)["kept"] and not job_outcome_value(tmp_path, first, 0)["kept"]
    both = [JobOutcome(0, "a", "ok", 0, kept=True), JobOutcome(1, "b", "ok", 0)]
    assert summary_line(both) == "2 jobs: 2 ok (1 measured, 1 kept from an earlier run by resume)"
    assert "nothing was measured" in summary_line([JobOutcome(0, "a", "ok", 0, kept=True)])


def test_resume_never_keeps_the_rows_a_checkout_shipped_but_keeps_this_machines_own(compose, tmp_path, capsys,
                                                                                    monkeypatch):
    """Rows committed and unchanged are the publisher's: a fresh clone measures them. Rows
    this machine wrote since (modified, or never committed) are its own, and resume keeps them."""
    import subprocess

    import kvbench.harness.untrusted.git as kv_git

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    monkeypatch.setattr(kv_git, "REPO_ROOT", tmp_path)  # the checkout kvbench runs from; the run folder is in it
    run_dir = tmp_path / "results" / "run"
    first, _ = run_job(compose(CAPACITY), run_dir)
    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "published")
    again, code = run_job(compose([*CAPACITY, "resume=true"]), run_dir)
    assert code == 0 and "published with this checkout" in capsys.readouterr().out
    assert not any(r.get("_kept") for r in again) and again[0]["wall_s"] != first[0]["wall_s"]
    # The re-measured rows differ from the commit: they are this machine's now, and resume keeps them.
    kept, code = run_job(compose([*CAPACITY, "resume=true"]), run_dir)
    assert code == 0 and all(r["_kept"] for r in kept) and kept[0]["wall_s"] == again[0]["wall_s"]
