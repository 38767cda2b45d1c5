"""Ctrl-C and SIGTERM as an orderly stop: the running impl gets a row, the process exits 128 + signal.

``JobInterrupted`` is a ``SystemExit``: the code that catches every ``Exception`` to turn
a failure into a row lets it through, and when nothing else catches it, Python exits
with its code and prints no traceback.
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class JobInterrupted(SystemExit):
    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Inside: SIGINT or SIGTERM raises ``JobInterrupted``; a second one exits at once.

    The second signal does not wait for the first one's row to be written: a user who
    presses Ctrl-C twice wants out. Only the main thread can set handlers; elsewhere
    (a launcher's worker thread) the defaults stay.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised = []

    def handler(signum, frame):
        if raised:
            os._exit(128 + signum)
        raised.append(signum)
        raise JobInterrupted(signum)

    previous = {s: signal.signal(s, handler) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
