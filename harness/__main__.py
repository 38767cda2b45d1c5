"""``kvbench [overrides]`` (or ``python -m harness [overrides]``): one run (or a sweep with -m) into Hydra's run folder.

A command line whose config Hydra cannot compose (``batch=abc``, ``model=nope``) is
checked here first, so that it gives what every bad value gives: one line, an error row
in the run folder, exit code 2. Each job of a ``-m`` sweep is checked by the sweeper.
The ``kvbench`` console script (pyproject.toml) is ``cli`` below: the same door, under a
name Hydra's shell completion can follow (``eval "$(kvbench -sc install=bash)"``).
``--version`` names kvbench's version and those of torch, Triton and Hydra; ``--help`` alone prints
Hydra's help page without Hydra composing the config (harness/front/help_page.py: well under a
second, not two); a pipe whose reader has gone (``kvbench --help | head -3``) ends the command
quietly (harness/console.py).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path


COMPLETION_FLAGS = ("-sc", "--shell-completion")


def completion_line(line: str) -> str:
    """Bash's ``COMP_LINE`` with the aliases of its finished words rewritten, as ``translate`` rewrites argv.

    Hydra's completion composes the finished words to offer keys (``+impl=paged impl.<TAB>``:
    ``impl.kernel=``); an alias there (``impl=paged``, ``max_num_seqs=4``) would not compose, and
    nothing would be offered. The word being typed stays as typed: bash keeps only the candidates
    that start with it.
    """
    from kvbench.harness.front.aliases import translate

    head, sep, typed = line.rpartition(" ")
    words = head.split()
    if not words:
        return line
    finished, _ = translate(words[1:])  # words[0] is the program (kvbench, or python -m harness)
    return " ".join([words[0], *finished]) + sep + typed


def _installed(*names: str) -> str | None:
    """The version of the first of ``names`` installed (a distribution's name, as pip knows it), or None."""
    from importlib.metadata import PackageNotFoundError, version

    for name in names:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def kvbench_version() -> str:
    """kvbench's version: the installed package's, else this checkout's pyproject.toml (run from source)."""
    if (installed := _installed("kvbench")) is not None:
        return installed
    try:
        import tomllib

        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"  # the checkout's root
        return tomllib.loads(pyproject.read_text())["project"]["version"]
    except (ImportError, OSError, KeyError, ValueError):  # Python 3.10 (no tomllib), or no pyproject beside it
        return "unknown"


def version_line() -> str:
    """``kvbench --version``: kvbench's own version, then those of what its rows depend on (read from the
    packages' metadata: nothing is imported, so it answers at once)."""
    deps = (("torch", ("torch",)), ("triton", ("triton", "pytorch-triton")), ("hydra", ("hydra-core",)))
    found = ", ".join(f"{label} {_installed(*names) or 'not installed'}" for label, names in deps)
    return f"kvbench {kvbench_version()} ({found})"


def _run(argv: list[str]) -> int | None:
    """One command line: ``calibrate ...``, ``--version``, or the aliases, the preflight check, then Hydra."""
    if argv[:1] == ["calibrate"]:  # the one subcommand (no Hydra key is named so): harness/front/calibrate.py
        from kvbench.harness.front.calibrate import main as calibrate

        return calibrate(argv[1:])
    if "--version" in argv:  # before Hydra (whose own --version names Hydra's) and its imports
        print(version_line())
        return 0
    from kvbench.harness.front.help_page import HELP_FLAGS, help_page

    if argv in HELP_FLAGS and (page := help_page()) is not None:  # Hydra's page, without composing (front/help_page.py)
        print(page)  # as Hydra's app_help prints it
        return 0
    from kvbench.harness.front.aliases import translate
    from kvbench.harness.front.app import main
    from kvbench.harness.front.preflight import check_command_line

    sys.argv[1:], notes = translate(argv)  # vLLM's key names, impl= without the +
    for note in notes:
        print(f"kvbench: note: {note}", file=sys.stderr)
    if "COMP_LINE" in os.environ and any(a in COMPLETION_FLAGS for a in sys.argv[1:]):
        os.environ["COMP_LINE"] = completion_line(os.environ["COMP_LINE"])  # Hydra's query reads it there
    if (code := check_command_line(sys.argv[1:])) is not None:
        return code
    _start_run()
    main()
    return None


class _CtrlC:
    """Whether a Ctrl-C came before the run started. A library that catches every exception while it imports (a bare
    ``except``) can swallow the KeyboardInterrupt, and the run would go on as if no key was pressed: the flag
    remembers it, and ``_start_run`` raises it again at the last point before the run."""

    seen = False

    @classmethod
    def handler(cls, signum, frame) -> None:
        cls.seen = True
        raise KeyboardInterrupt


def _start_run() -> None:
    """Stop here if a Ctrl-C came and was swallowed; else hand SIGINT back to Python's own handler for the run."""
    if _CtrlC.seen:
        raise KeyboardInterrupt
    if signal.getsignal(signal.SIGINT) is _CtrlC.handler:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def cli() -> None:
    """What ``kvbench ARGS`` and ``python -m harness ARGS`` do; a closed pipe (``| head``) ends it quietly."""
    from kvbench.harness.console import quiet_when_closed

    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where a parent chose to ignore it
        signal.signal(signal.SIGINT, _CtrlC.handler)
    try:  # a Ctrl-C before a run has started (imports, composing): one line, no traceback
        code = quiet_when_closed(lambda: _run(sys.argv[1:]))
    except KeyboardInterrupt:
        print("kvbench: interrupted before any run started; nothing was written", file=sys.stderr, flush=True)
        # os._exit: nothing to clean up yet, and interpreter shutdown mid-import can raise the
        # interrupt again and end the process by SIGINT (exit -2) instead of 130.
        os._exit(130)
    sys.exit(code)


if __name__ == "__main__":
    cli()
