"""``isolation=process``: one impl of a job in a spawned process of its own.

Its allocator peaks, its NVML baseline and its CUDA context start from nothing, and a
fault that kills the process (a CUDA error that poisons the context, a segfault in a
kernel) becomes that impl's error row while the job goes on with the next impl.
The child works on a copy of the job's side tables and memo and hands them back with
its rows and tokens; the parent folds them into its own context.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

from kvbench.harness.config import Config, ImplConfig
from kvbench.harness.scenarios.context import JobContext
from kvbench.harness.job.impl_runner import ImplResult, run_impl
from kvbench.harness.job.interrupts import SIGNALS
from kvbench.harness.measure.fingerprint import Fingerprint


def _exit_with(parent_pid: int) -> None:
    """End this process when its parent is gone (killed with -9): no orphan keeps the GPU."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _child(cfg: Config, run_dir: Path, fingerprint: Fingerprint, impl: ImplConfig, tables: dict, memo: dict,
           conn, parent_pid: int) -> None:
    _exit_with(parent_pid)
    ctx = JobContext(cfg, run_dir, fingerprint, tables=tables, memo=memo)
    result = run_impl(ctx, impl)
    conn.send((result, ctx.out.tokens, ctx.out.tables, ctx.job.memo))
    conn.close()


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def _start_ignoring_ctrl_c(proc) -> None:
    """Start ``proc`` with SIGINT ignored from its first instruction (a disposition exec keeps).

    Ctrl-C reaches the whole process group; the parent alone decides what it stops, and
    a child still importing would otherwise print a KeyboardInterrupt traceback.
    """
    if threading.current_thread() is not threading.main_thread():
        proc.start()
        return
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        proc.start()
    finally:
        if handler is not None:
            signal.signal(signal.SIGINT, handler)


def run_in_process(ctx: JobContext, impl: ImplConfig) -> ImplResult:
    """``run_impl`` in a spawned process; a process that dies without a result is an error row."""
    mp = multiprocessing.get_context("spawn")  # fork would copy a CUDA context, which CUDA forbids
    receive, send = mp.Pipe(duplex=False)
    proc = mp.Process(target=_child, name=f"kvbench-{impl.name}", daemon=True,
                      args=(ctx.job.cfg, ctx.job.run_dir, ctx.job.fingerprint, impl, ctx.out.tables, ctx.job.memo, send,
                            os.getpid()))
    _start_ignoring_ctrl_c(proc)
    send.close()  # the child holds the only write end: its exit ends recv() below
    try:
        try:
            result, tokens, tables, memo = receive.recv()
        except EOFError:  # the process died before it could answer
            result = None
        proc.join()
    except BaseException:  # interrupted: the impl stops with the job
        proc.kill()
        proc.join()
        raise
    finally:
        receive.close()
    if result is None:
        status = "interrupted" if proc.exitcode is not None and -proc.exitcode in SIGNALS else "error"
        row = {**ctx.identifiers(impl), "status": status,
               "error": f"impl process (isolation=process) {_exit_text(proc.exitcode)} before it wrote a row"}
        return ImplResult([row], 1)
    ctx.out.tokens.extend(tokens)
    ctx.out.tables.clear()
    ctx.out.tables.update(tables)
    ctx.job.memo.update(memo)
    return result
