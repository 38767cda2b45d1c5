"""How kvbench asks git about its checkout: read-only, always.

``git status`` refreshes the index under ``.git/index.lock`` when it can. A run only reads the
checkout (its commit, whether it is dirty, whether a results file is the committed one), and
several runs at once (make sweep's bookkeeping sweeps), or one killed mid-call, must never leave
a lock behind that stops the user's next commit. ``GIT_OPTIONAL_LOCKS=0`` tells git to take no
lock it does not need.
"""

from __future__ import annotations

import os


def read_only_git_env() -> dict[str, str]:
    """The environment for every git call kvbench makes: this process's, with optional locks off."""
    return {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
