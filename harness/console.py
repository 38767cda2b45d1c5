"""kvbench's commands behave as Unix tools do: a usage error is one line and exit 2, and a command whose
reader goes away (``kvbench --help | head -3``) ends quietly.

Once the reading end of a pipe is closed, every write to it fails with EPIPE. Python ignores
SIGPIPE, so the write raises BrokenPipeError instead: Hydra catches it like any error and prints
a traceback (exit 1); elsewhere it ends the process with one, or with "Exception ignored" at the
interpreter's last flush. Python's advice (https://docs.python.org/3/library/signal.html#note-on-sigpipe)
is to catch it and point the stream at /dev/null, so that nothing writes to the closed pipe again;
setting SIGPIPE back to SIG_DFL instead would kill a run between two rows.

``quiet_when_closed`` applies that advice at the write itself, wherever it happens (inside Hydra's
own handler too): the stream goes to /dev/null and the command goes on to its end, so a run still
writes all its rows. The exit status is then 141 (128 + SIGPIPE), what a shell reports for any
tool its pipe's reader left (``yes | head``), unless the command failed for a reason of its own.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Callable, NoReturn, TextIO

SIGPIPE_EXIT = 128 + signal.SIGPIPE  # 141


USAGE_ERROR = 2  # what every refusal of kvbench's exits with (harness/front/compose_errors.py CONFIG_ERROR_CODE)


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser whose usage errors are one line, naming ``--help``, with exit code 2.

    argparse prints the whole usage block before the error; a refusal of kvbench is one line."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def unwritable(folder: Path) -> str | None:
    """Why nothing can be written under ``folder`` (a file in its path, no permission, /proc, ...), or None.

    Probed with a file written and removed in ``folder``, or in the nearest folder above it that exists:
    nothing is created, so a command refused for another reason leaves no empty folder behind.
"""
    existing = next(p for p in [folder.absolute(), *folder.absolute().parents] if p.exists())
    if not existing.is_dir():
        return f"{existing} is not a folder"
    probe = existing / f".kvbench-probe-{os.getpid()}"
    try:
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        return f"{type(e).__name__}: {e.strerror or e}"
    return None


class QuietWhenClosed:
    """A text stream that goes to /dev/null once its reader has gone, instead of raising BrokenPipeError."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.reader_gone = False

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._to_devnull()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._to_devnull()
            self._stream.flush()  # what the failed flush left buffered: into /dev/null now

    def _to_devnull(self) -> None:
        self.reader_gone = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())  # the descriptor itself: every later writer, children too
        finally:
            os.close(devnull)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)  # fileno, isatty, encoding, buffer, ...


def quiet_when_closed(command: Callable[[], int | str | None]) -> int | str | None:
    """``command()``'s exit status (a SystemExit's too), with stdout and stderr that go quiet once their reader
    has gone; then 141 in place of a success. The streams are put back afterwards."""
    saved = sys.stdout, sys.stderr
    out, err = QuietWhenClosed(sys.stdout), QuietWhenClosed(sys.stderr)
    sys.stdout, sys.stderr = out, err
    try:
        try:
            code = command()
        except SystemExit as e:  # argparse, Hydra's --help and a run's own exit
            code = e.code
        except BrokenPipeError:  # a write that did not go through sys.stdout (its .buffer, a handler kept from before)
            out._to_devnull()
            code = 0
        out.flush()
        err.flush()
    finally:
        sys.stdout, sys.stderr = saved
    return SIGPIPE_EXIT if (out.reader_gone or err.reader_gone) and code in (0, None) else code
