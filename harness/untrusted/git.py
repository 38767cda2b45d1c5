"""How kvbench asks git about its own checkout: read-only, from the checkout's root, never from a folder it reads.

Git finds its repository, its config and its attributes from the working directory: asked from
inside a results folder, it would take a ``.git`` planted there as the repository, and that
repository's config can run commands (``core.fsmonitor``, ``core.sshCommand``, filters, diff
drivers, hooks of the commands that have them). Switching off one setting leaves the others. So:

- every call runs in the checkout root kvbench chose (``repo``, by default this checkout), with
  ``GIT_DIR`` and ``GIT_WORK_TREE`` naming it: git discovers nothing, wherever a folder sits;
- a path a folder gives goes after ``--`` and must lie inside the checkout, and a commit a row
  names must be a hex object id: nothing a folder holds becomes an option (``--output=FILE``);
- whether a file is the committed one is answered from the object database alone (its blob id
  at HEAD against the bytes on disk), which reads no index, attribute or filter.

``git status`` refreshes the index under ``.git/index.lock`` when it can. A run only reads the
checkout, and several runs at once, or one killed mid-call, must never leave a lock behind that
stops the user's next commit: ``GIT_OPTIONAL_LOCKS=0`` tells git to take no lock it does not need.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path

from kvbench.harness.paths import REPO_ROOT
from kvbench.harness.untrusted import TABLE_LIMIT, UntrustedError, read_bytes

_OBJECT_ID = re.compile(r"[0-9a-f]{7,64}")


def read_only_git_env(repo: Path = REPO_ROOT) -> dict[str, str]:
    """The environment of every git call: this process's, pointed at ``repo`` alone, optional locks off."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}  # no inherited redirection
    return {**env, "GIT_DIR": str(Path(repo) / ".git"), "GIT_WORK_TREE": str(repo), "GIT_OPTIONAL_LOCKS": "0",
            "GIT_TERMINAL_PROMPT": "0"}


def git(*args: str, repo: Path = REPO_ROOT, timeout: float = 10) -> subprocess.CompletedProcess | None:
    """``git ARGS`` about ``repo`` (text output), or None when git is missing or too slow."""
    try:
        return subprocess.run(["git", "-c", "core.fsmonitor=false", *args], cwd=repo, capture_output=True,
                              text=True, timeout=timeout, env=read_only_git_env(repo), stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None


def is_object_id(text: object) -> bool:
    """A commit named by its hex id (abbreviated or whole), as a row records it; anything else is refused."""
    return isinstance(text, str) and _OBJECT_ID.fullmatch(text) is not None


def _blob_id(data: bytes, hex_length: int) -> str:
    """Git's id of a blob holding ``data``: SHA-1 (40 hex digits) or SHA-256 (64), per the repository."""
    digest = hashlib.sha256 if hex_length == 64 else hashlib.sha1
    return digest(b"blob %d\0" % len(data) + data).hexdigest()


def committed_unchanged(path: Path, repo: Path | None = None) -> bool:
    """Whether the file at ``path`` is in ``repo``'s (by default kvbench's own checkout's) HEAD commit with the
    same bytes; False when it lies outside the checkout, is not committed, cannot be read as a file, or git
    cannot say."""
    repo = REPO_ROOT if repo is None else repo
    try:
        rel = Path(path).resolve().relative_to(Path(repo).resolve())
    except (ValueError, OSError):
        return False
    committed = git("rev-parse", "--verify", "--quiet", f"HEAD:{rel.as_posix()}", repo=repo)
    if committed is None or committed.returncode != 0 or not is_object_id(blob := committed.stdout.strip()):
        return False
    try:
        data = read_bytes(path, TABLE_LIMIT, root=repo)
    except UntrustedError:
        return False
    return _blob_id(data, len(blob)) == blob
