"""The sweep's progress: one whole line per finished job, with the counts so far and an ETA.

A real sweep's lines, in order with the jobs' own output, are checked in tests/jobs/test_sweep_progress.py.
"""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest

from harness.front.sweeper import JobOutcome, ReportingTask, SweepProgress, _duration


def progress_after(outcomes: list[JobOutcome], total: int, elapsed: float) -> str:
    progress = SweepProgress(total=total, enabled=False, started=0.0)
    for o in outcomes:
        progress.job_done(o)
    return progress.line(outcomes[-1], now=elapsed)


def test_a_line_says_how_far_the_sweep_is_and_when_it_ends():
    line = progress_after([JobOutcome(0, "r/0", "ok", 0), JobOutcome(1, "r/1", "error", 2),
                           JobOutcome(2, "r/2", "ok", 0)], total=12, elapsed=30.0)
    assert line == ("kvbench: [#####---------------] 3/12 jobs done (job 2: ok): 2 ok, 1 error; "
                    "eta 1 min 30 s (10.0 s/job)")  # 30 s over 3 jobs, 9 left


def test_the_last_line_says_the_sweep_is_done():
    line = progress_after([JobOutcome(0, "r/0", "oom", 1), JobOutcome(1, "r/1", "ok", 0)], total=2, elapsed=4000.0)
    assert line.endswith("2/2 jobs done (job 1: ok): 1 ok, 0 error, 1 oom; done in 1 h 06 min")
    assert "[####################]" in line


def test_jobs_kept_by_resume_count_as_done_but_not_in_the_mean():
    kept = [JobOutcome(i, f"r/{i}", "ok", 0, kept=True) for i in range(4)]
    assert "eta" not in progress_after(kept, total=8, elapsed=0.5)  # nothing measured yet: no guess
    line = progress_after([*kept, JobOutcome(4, "r/4", "ok", 0)], total=8, elapsed=20.0)
    assert line.endswith("5/8 jobs done (job 4: ok): 5 ok, 0 error; eta 1 min 00 s (20.0 s/job)")


@pytest.mark.parametrize("seconds, shown", [(0.4, "0 s"), (59.4, "59 s"), (61, "1 min 01 s"), (7260, "2 h 01 min")])
def test_durations_read_at_a_glance(seconds, shown):
    assert _duration(seconds) == shown


def test_each_job_is_reported_once_on_stderr_as_whole_lines(capsys):
    progress = SweepProgress(total=2, started=0.0)
    progress.job_done(JobOutcome(0, "r/0", "ok", 0))
    progress.job_done(JobOutcome(0, "r/0", "ok", 0))  # the task reported it, then the sweeper
    progress.job_done(JobOutcome(1, "r/1", "error", 1))
    out, err = capsys.readouterr()
    assert out == "" and "\r" not in err
    first, last = err.splitlines()
    assert first.startswith("kvbench: [##########----------] 1/2 jobs done (job 0: ok): 1 ok, 0 error; eta ")
    assert last.startswith("kvbench: [####################] 2/2 jobs done (job 1: error): 1 ok, 1 error; done in ")


def test_progress_false_silences_it_and_a_copy_in_a_worker_process_stays_silent(capsys):
    quiet = SweepProgress(total=1, enabled=False)
    quiet.job_done(JobOutcome(0, "r/0", "ok", 0))
    assert quiet.done and capsys.readouterr().err == ""
    copy = pickle.loads(pickle.dumps(SweepProgress(total=1)))  # as joblib and submitit send the task
    copy.owner_pid = -1  # unpickled in a worker: another process than the sweeper's
    copy.job_done(JobOutcome(0, "r/0", "ok", 0))
    assert not copy.done and capsys.readouterr().err == ""


def task_returning(value):
    def task(cfg):
        if isinstance(value, Exception):
            raise value
        return value
    return task


@pytest.fixture
def job_three(monkeypatch):
    """Hydra's config of the job being run, as the launcher sets it before calling the task."""
    from hydra.core.hydra_config import HydraConfig

    monkeypatch.setattr(HydraConfig, "get", staticmethod(
        lambda: SimpleNamespace(job=SimpleNamespace(num=3), runtime=SimpleNamespace(output_dir="sweep/3"))))


def test_the_task_reports_its_job_as_it_ends(job_three):
    progress = SweepProgress(total=5, enabled=False)
    value = {"run_dir": "sweep/3", "status": "oom", "code": 1, "kept": False}
    assert ReportingTask(task_returning(value), progress)(None) == value  # the launcher gets the value unchanged
    assert progress.done == {3: JobOutcome(3, "sweep/3", "oom", 1)}


def test_a_task_that_raises_is_reported_as_an_error_and_still_raises(job_three):
    progress = SweepProgress(total=5, enabled=False)
    with pytest.raises(RuntimeError):
        ReportingTask(task_returning(RuntimeError("boom")), progress)(None)
    assert progress.done == {3: JobOutcome(3, "sweep/3", "error", 1)}


def test_jobs_reported_at_one_moment_guess_the_eta_once(capsys):
    """A parallel launcher's jobs come back together: only the last of them says when the sweep ends."""
    progress = SweepProgress(total=4, started=0.0)
    for k, num in enumerate((0, 1)):
        progress.job_done(JobOutcome(num, f"r/{num}", "ok", 0), eta=k == 1)
    first, second = capsys.readouterr().err.splitlines()
    assert "eta" not in first and "; eta " in second

