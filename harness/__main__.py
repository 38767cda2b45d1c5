"""``python -m harness [overrides]``: one run (or a sweep with -m) into Hydra's run folder.

A command line whose config Hydra cannot compose (``batch=abc``, ``model=nope``) is
checked here first, so that it gives what every bad value gives: one line, an error row
in the run folder, exit code 2. Each job of a ``-m`` sweep is checked by the sweeper.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    try:  # a Ctrl-C before a run has started (imports, composing): one line, no traceback
        from harness.front.aliases import translate
        from harness.front.app import main
        from harness.front.preflight import check_command_line

        sys.argv[1:], notes = translate(sys.argv[1:])  # vLLM's key names, impl= without the +
        for note in notes:
            print(f"kvbench: note: {note}", file=sys.stderr)
        if (code := check_command_line(sys.argv[1:])) is not None:
            sys.exit(code)
        main()
    except KeyboardInterrupt:
        print("kvbench: interrupted before any run started; nothing was written", file=sys.stderr, flush=True)
        # os._exit: nothing to clean up yet, and interpreter shutdown mid-import can raise the
        # interrupt again and end the process by SIGINT (exit -2) instead of 130.
        os._exit(130)
