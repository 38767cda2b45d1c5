"""Hydra's records of a job, without the paths of the machine that ran it.

A results folder is published: its ``.hydra/hydra.yaml`` and the sweep's ``multirun.yaml``
would otherwise carry the absolute paths of whoever ran it (the checkout, the conf folder,
the output folder, a home directory). Paths inside the checkout become relative to it, and
a home directory becomes ``~``; every other value is kept as Hydra wrote it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from kvbench.harness.paths import REPO_ROOT


def portable_path(text: str, repo: Path = REPO_ROOT, home: str | None = None) -> str:
    """``text`` with the checkout's absolute path made relative (``.`` for the checkout itself)
    and the user's home directory written as ``~``; text that names neither is returned as is."""
    home = os.path.expanduser("~") if home is None else home
    root = str(repo)
    if text == root:
        return "."
    if text.startswith(root + os.sep):
        text = text[len(root) + 1:]
    elif home not in ("", "/") and (text == home or text.startswith(home + os.sep)):
        text = "~" + text[len(home):]
    # A path inside a longer string (a "file://..." config source, a command line) is made portable too;
    # the lookahead keeps a sibling such as /work/main2 whole.
    text = re.sub(re.escape(root + os.sep), "", text)
    return re.sub(re.escape(root) + r"(?![\w.-])", ".", text)


def _scrub(value: Any, repo: Path, home: str | None) -> Any:
    if isinstance(value, dict):
        return {k: _scrub(v, repo, home) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub(v, repo, home) for v in value]
    if isinstance(value, str):
        return portable_path(value, repo, home)
    return value


def portable(node: DictConfig | ListConfig | dict | list, repo: Path = REPO_ROOT,
             home: str | None = None) -> DictConfig | ListConfig:
    """A copy of ``node`` (unresolved: interpolations stay as written) whose string values hold no machine path."""
    plain = OmegaConf.to_container(node, resolve=False) if OmegaConf.is_config(node) else node
    return OmegaConf.create(_scrub(plain, repo, home))
