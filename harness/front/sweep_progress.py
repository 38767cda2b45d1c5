"""The sweep's progress: tqdm's bar on stderr, on a terminal only, moved on as each job ends."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from kvbench.harness.front.sweep_outcome import JobOutcome

BAR_FORMAT = "{desc}: [{bar:20}] {n_fmt}/{total_fmt} jobs{postfix} [{elapsed}<{remaining}, {rate_fmt}]"


def _on_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a replaced or closed stream
        return False


class _AboveTheBar:
    """A text stream whose lines are written with the sweep's bar cleared, then drawn again under them
    (tqdm's ``external_write_mode`` on the bar's own file: its ``tqdm.write`` guesses the bar's
    file from sys.stdout and sys.stderr, which kvbench wraps, and would write through the bar)."""

    def __init__(self, stream: Any, bar: Any) -> None:
        self._stream, self._bar, self._partial = stream, bar, ""

    def write(self, text: str) -> int:
        self._partial += text
        if "\n" in self._partial:
            lines, _, self._partial = self._partial.rpartition("\n")
            self._write(lines + "\n")
        return len(text)

    def _write(self, text: str) -> None:
        from tqdm import tqdm

        with tqdm.external_write_mode(file=self._bar.fp):
            self._stream.write(text)
            self._stream.flush()

    def flush(self) -> None:
        if self._partial:
            text, self._partial = self._partial, ""
            self._write(text)
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)  # fileno, isatty, encoding, buffer, ...


@dataclass
class SweepProgress:
    """tqdm's bar on stderr, moved on as each job of a sweep ends, e.g.
    ``kvbench: [#####               ] 3/12 jobs, 2 ok, 1 error (job 2: ok) [00:30<01:30, 10.00s/job]``:
    the counts so far (ok and error always shown), the job that just ended, tqdm's elapsed time,
    ETA and rate. On a terminal only: a pipe or a log file (make sweep > log) gets no bar and no
    carriage returns, just the jobs' own output and the summary line. The jobs' own output goes
    above the bar (``output_above``). The ETA is tqdm's, on the measured jobs only: jobs kept by
    resume take no time, so they count as done (``n``) and as tqdm's ``initial``, out of the rate
    (no ETA, ``?``, until one job was measured); smoothing off, so the rate is the mean so far.
    """

    total: int
    enabled: bool = True
    started: float = field(default_factory=time.monotonic)
    # The process that owns the counts. A launcher that runs jobs in other processes (joblib,
    # submitit) pickles the task, and this with it: a copy there must stay silent.
    owner_pid: int = field(default_factory=os.getpid)
    done: dict[int, JobOutcome] = field(default_factory=dict)
    bar: Any = field(default=None, repr=False, compare=False)  # the live tqdm, in the owner on a terminal

    def __getstate__(self) -> dict:
        return {**self.__dict__, "bar": None}  # a worker's copy draws nothing

    def start(self, total: int, enabled: bool) -> None:
        """Size it once the jobs are known, start the clock, and open the bar where it is shown."""
        self.close()
        self.total, self.enabled, self.started = total, enabled, time.monotonic()
        if enabled and _on_terminal(sys.stderr):
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="kvbench", unit="job", bar_format=BAR_FORMAT, smoothing=0,
                            mininterval=0, dynamic_ncols=True, file=sys.stderr)

    @property
    def live(self) -> bool:
        return self.bar is not None and os.getpid() == self.owner_pid

    def _counts(self, outcome: JobOutcome) -> str:
        counts: dict[str, int] = {"ok": 0, "error": 0}  # both always shown: a reader looks for them
        for o in self.done.values():
            counts[o.status] = counts.get(o.status, 0) + 1
        return ", ".join(f"{k} {status}" for status, k in counts.items()) + f" (job {outcome.num}: {outcome.status})"

    def _kept(self) -> int:
        return sum(o.kept for o in self.done.values())

    def line(self, outcome: JobOutcome, now: float | None = None) -> str:
        """What the bar shows after ``outcome`` (tqdm's meter, ``now`` on the monotonic clock)."""
        from tqdm import tqdm

        elapsed = (time.monotonic() if now is None else now) - self.started
        return tqdm.format_meter(len(self.done), self.total, elapsed, prefix="kvbench", unit="job", ascii=" #",
                                 bar_format=BAR_FORMAT, postfix=self._counts(outcome), initial=self._kept())

    def job_done(self, outcome: JobOutcome, draw: bool = True) -> None:
        """Record ``outcome`` and move the bar on, once per job (the task and the sweeper may both report it).

        ``draw=False``: one of several jobs reported at the same moment; only the last is drawn."""
        if os.getpid() != self.owner_pid or outcome.num in self.done:
            return
        self.done[outcome.num] = outcome
        if self.live:
            self.bar.initial = self._kept()
            self.bar.n = len(self.done)
            self.bar.set_postfix_str(self._counts(outcome), refresh=False)
            if draw:
                self.bar.refresh()

    def write(self, message: str) -> None:
        """A line on stderr above the bar (the bar is drawn again under it)."""
        if self.live:
            _AboveTheBar(sys.stderr, self.bar).write(message + "\n")
        else:
            print(message, file=sys.stderr)

    @contextlib.contextmanager
    def output_above(self) -> Iterator[None]:
        """While the bar is drawn, what the sweep prints goes above it (``_AboveTheBar``): stdout (the
        jobs' tables, and the log handlers a job configures on it) and the root logger's console
        handlers (Hydra's ``Launching 2 jobs locally``). stderr itself is left alone: a job's own
        per-impl tqdm bars draw there."""
        if not self.live:
            yield
            return
        handlers = [h for h in logging.root.handlers
                    if isinstance(h, logging.StreamHandler) and h.stream in (sys.stdout, sys.stderr)]
        streams = [h.stream for h in handlers]
        try:
            for h in handlers:
                h.setStream(_AboveTheBar(h.stream, self.bar))
            out = _AboveTheBar(sys.stdout, self.bar)
            with contextlib.redirect_stdout(out):
                try:
                    yield
                finally:
                    out.flush()
        finally:
            for h, stream in zip(handlers, streams):
                h.setStream(stream)

    def close(self) -> None:
        """Leave the bar's last state on the terminal and stop drawing it."""
        if self.live:
            self.bar.close()
        self.bar = None
