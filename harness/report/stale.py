"""Rows that no longer describe this checkout: measured by older code, or filed under another machine's folder.

A published figure is only as current as the code that made it. A row whose ``git_sha`` is
older than the checkout's code (a file under the code paths below changed since), or that is
not in the checkout's history at all, is stale: the report says so beside it instead of
quoting it as today's. A row filed under ``results/<slug>/`` whose own ``device_slug`` is
another machine's is stale too (copied, or measured before the slug named the CPU model).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path, PurePosixPath

import pandas as pd

from kvbench.harness.untrusted.git import git, is_object_id
from kvbench.harness.paths import REPO_ROOT

# What a row's figures depend on; documentation and the results themselves do not count.
CODE_PATHS = ("harness", "impls", "kernels", "conf", "hydra_plugins", "pyproject.toml",
              ":(exclude)harness/report")  # the report reads finished rows: a change there measures nothing
RESULTS_FOLDER = "results"  # results/<device slug>/<sweep>/<job>: the slug a row is filed under


def _git(*args: str, repo: Path):
    return git(*args, repo=repo, timeout=20)


@lru_cache(maxsize=256)
def code_changes_since(sha: str, repo: Path = REPO_ROOT) -> str | None:
    """Why the code at ``sha`` is not this checkout's (a short reason), or None when it is the same code,
    or when git cannot say (no git, not a checkout: nothing is flagged on a guess). ``sha`` comes from a row, which
    is data: only a hex commit id is ever given to git (``--output=FILE`` would be an option)."""
    if not is_object_id(sha):
        return f"its git_sha {sha[:20]!r} is not a commit id"
    head = _git("rev-parse", "HEAD", repo=repo)
    if head is None or head.returncode != 0:
        return None
    known = _git("cat-file", "-e", f"{sha}^{{commit}}", repo=repo)
    if known is None or known.returncode != 0:
        return f"its commit {sha[:7]} is not in this checkout's history"
    diff = _git("diff", "--name-only", sha, "HEAD", "--", *CODE_PATHS, repo=repo)
    if diff is None or diff.returncode != 0:
        return None
    files = [f for f in diff.stdout.splitlines() if f]
    if not files:
        return None
    # No count of commits: every commit (a results one too) would change it, and the published report, regenerated
    # on a fresh clone, would never be the committed one. The code files changed move only when code does.
    return f"code changed since {sha[:7]} ({len(files)} code files)"


def filed_slug(run_dir: str) -> str | None:
    """The device slug a run folder is filed under (the folder after ``results/``), or None."""
    parts = PurePosixPath(run_dir).parts
    for i, part in enumerate(parts[:-2]):  # results/<slug>/<sweep or run>/...: the slug is never the run itself
        if part == RESULTS_FOLDER:
            return parts[i + 1]
    return None


def stale_reasons(rows: pd.DataFrame, repo: Path = REPO_ROOT) -> pd.Series:
    """Per row: why it is stale ("; "-joined), or None."""
    def reason(row) -> str | None:
        why = []
        sha = row.get("git_sha")
        if isinstance(sha, str) and sha:
            if (changed := code_changes_since(sha, repo)) is not None:
                why.append(changed)
        dirty = row.get("git_dirty")
        if dirty is not None and dirty is not pd.NA and bool(dirty):
            why.append("measured by uncommitted code")
        filed, own = filed_slug(str(row.get("run_dir", ""))), row.get("device_slug")
        if filed and isinstance(own, str) and own and filed != own:
            why.append(f"measured on {own}, filed under {filed}")
        return "; ".join(why) or None

    if rows.empty:
        return pd.Series([], dtype=object)
    return pd.Series([reason(r) for r in rows.to_dict("records")], index=rows.index, dtype=object)
