"""The sweep's progress: tqdm's bar, moved on as each job ends, with the counts so far, the ETA and rate.

A real sweep's bar, in order with the jobs' own output, is checked in tests/jobs/test_sweep_progress.py.
"""

from __future__ import annotations

import io
import pickle
import sys
from types import SimpleNamespace

import pytest

from kvbench.harness.front.sweeper import JobOutcome, ReportingTask, SweepProgress


def progress_after(outcomes: list[JobOutcome], total: int, elapsed: float) -> str:
    progress = SweepProgress(total=total, enabled=False, started=0.0)
    for o in outcomes:
        progress.job_done(o)
    return progress.line(outcomes[-1], now=elapsed)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def on_terminal(monkeypatch) -> Terminal:
    """stderr as a terminal: what the bar drew, carriage returns and all (set in the test itself:
    pytest's capture puts its own stderr back after the fixtures)."""
    err = Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    return err


def drawn(err: Terminal) -> list[str]:
    """Each state of the bar, in order (tqdm redraws in place after a carriage return)."""
    return [s for s in err.getvalue().replace("\n", "\r").split("\r") if s.startswith("kvbench: [")]


def test_a_line_says_how_far_the_sweep_is_and_when_it_ends():
    line = progress_after([JobOutcome(0, "r/0", "ok", 0), JobOutcome(1, "r/1", "error", 2),
                           JobOutcome(2, "r/2", "ok", 0)], total=12, elapsed=30.0)
    # 30 s over 3 jobs, 9 left: 1 min 30 s more, 10 s a job
    assert line == "kvbench: [#####               ] 3/12 jobs, 2 ok, 1 error (job 2: ok) [00:30<01:30, 10.00s/job]"


def test_the_last_line_says_the_sweep_is_done():
    line = progress_after([JobOutcome(0, "r/0", "oom", 1), JobOutcome(1, "r/1", "ok", 0)], total=2, elapsed=4000.0)
    assert line.endswith("2/2 jobs, 1 ok, 0 error, 1 oom (job 1: ok) [1:06:40<00:00, 2000.00s/job]")
    assert "[####################]" in line


def test_jobs_kept_by_resume_count_as_done_but_not_in_the_mean():
    kept = [JobOutcome(i, f"r/{i}", "ok", 0, kept=True) for i in range(4)]
    assert "<?," in progress_after(kept, total=8, elapsed=0.5)  # nothing measured yet: no guess
    line = progress_after([*kept, JobOutcome(4, "r/4", "ok", 0)], total=8, elapsed=20.0)
    assert line.endswith("5/8 jobs, 5 ok, 0 error (job 4: ok) [00:20<01:00, 20.00s/job]")


def test_each_job_moves_the_bar_once_on_a_terminal(monkeypatch):
    terminal = on_terminal(monkeypatch)
    progress = SweepProgress(total=0)
    progress.start(2, enabled=True)
    progress.job_done(JobOutcome(0, "r/0", "ok", 0))
    progress.job_done(JobOutcome(0, "r/0", "ok", 0))  # the task reported it, then the sweeper
    progress.write("kvbench: job 1: error: ConfigError: batch=abc")  # above the bar
    progress.job_done(JobOutcome(1, "r/1", "error", 1))
    progress.close()
    states = drawn(terminal)
    assert states[0].startswith("kvbench: [                    ] 0/2 jobs [00:00<?")
    assert sum("1/2 jobs, 1 ok, 0 error (job 0: ok) [" in s for s in states) == 2  # drawn, and again under the line
    assert states[-1].startswith("kvbench: [####################] 2/2 jobs, 1 ok, 1 error (job 1: error) [")
    assert "\nkvbench: job 1: error: ConfigError: batch=abc\n" in terminal.getvalue().replace("\r", "\n")
    assert terminal.getvalue().endswith("\n")  # the last state stays on the terminal


def test_a_pipe_or_a_log_gets_no_bar(capsys):
    progress = SweepProgress(total=0)
    progress.start(2, enabled=True)  # stderr is pytest's capture: not a terminal
    progress.job_done(JobOutcome(0, "r/0", "ok", 0))
    progress.write("kvbench: job 1: error: ConfigError: batch=abc")
    progress.job_done(JobOutcome(1, "r/1", "error", 1))
    progress.close()
    out, err = capsys.readouterr()
    assert out == "" and err == "kvbench: job 1: error: ConfigError: batch=abc\n"
    assert len(progress.done) == 2  # still counted


def test_progress_false_silences_it_and_a_copy_in_a_worker_process_stays_silent(monkeypatch):
    terminal = on_terminal(monkeypatch)
    quiet = SweepProgress(total=0)
    quiet.start(1, enabled=False)
    quiet.job_done(JobOutcome(0, "r/0", "ok", 0))
    assert quiet.done and terminal.getvalue() == ""
    shown = SweepProgress(total=0)
    shown.start(1, enabled=True)
    copy = pickle.loads(pickle.dumps(shown))  # as joblib and submitit send the task
    assert copy.bar is None  # a worker's copy draws nothing
    copy.owner_pid = -1  # unpickled in a worker: another process than the sweeper's
    copy.job_done(JobOutcome(0, "r/0", "ok", 0))
    assert not copy.done
    shown.close()


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


def test_jobs_reported_at_one_moment_are_drawn_once(monkeypatch):
    """A parallel launcher's jobs come back together: the bar is drawn once, at the last of them."""
    terminal = on_terminal(monkeypatch)
    progress = SweepProgress(total=0)
    progress.start(4, enabled=True)
    for k, num in enumerate((0, 1)):
        progress.job_done(JobOutcome(num, f"r/{num}", "ok", 0), draw=k == 1)
    states = drawn(terminal)
    assert not any(" 1/4 jobs" in s for s in states) and " 2/4 jobs, 2 ok, 0 error (job 1: ok) [" in states[-1]
    progress.close()


def test_the_jobs_output_and_the_log_go_above_the_bar(monkeypatch):
    import logging

    terminal = on_terminal(monkeypatch)
    monkeypatch.setattr(sys, "stdout", terminal)  # one terminal shows both
    handler = logging.StreamHandler(sys.stdout)  # as Hydra's console handler
    monkeypatch.setattr(logging.root, "handlers", [handler])
    monkeypatch.setattr(logging.root, "level", logging.INFO)
    progress = SweepProgress(total=0)
    progress.start(5, enabled=True)
    with progress.output_above():
        logging.getLogger("hydra").info("Launching 1 jobs locally")
        print("results: sweep/3")
        progress.job_done(JobOutcome(3, "sweep/3", "ok", 0))
    progress.close()
    assert logging.root.handlers == [handler]  # the log's handlers as they were
    shown = terminal.getvalue()
    # the bar is cleared, each line written on a line of its own, the bar drawn again under it
    assert "\r" + " " * 20 in shown[shown.index("0/5 jobs"):shown.index("Launching")]
    assert "\rLaunching 1 jobs locally\n" in shown and "\rresults: sweep/3\n" in shown
    assert shown.index("Launching") < shown.index("results: sweep/3\n") < shown.index("1/5 jobs, 1 ok")


def test_a_pipe_keeps_its_stdout_and_log(capsys):
    progress = SweepProgress(total=0)
    progress.start(1, enabled=True)  # not a terminal: nothing is redirected
    with progress.output_above():
        assert type(sys.stdout).__name__ != "_AboveTheBar"
        print("results: sweep/0")
    progress.close()
    assert capsys.readouterr().out == "results: sweep/0\n"
