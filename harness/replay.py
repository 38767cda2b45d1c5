"""``python -m harness.replay RUN_DIR [--out DIR]``: the command's path, kept; the code is harness/front/replay.py."""

import sys

from kvbench.harness.front.replay import main

if __name__ == "__main__":
    sys.exit(main())
