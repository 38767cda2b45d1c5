"""Where kvbench's own files are: the one home of the repository and config folder paths.

Absolute paths: Hydra reads a relative ``config_path`` of a module (not ``__main__``) as a package.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = REPO_ROOT / "conf"  # conf/: the Hydra config groups (impl/, model/, gpu/, slo/, sweep/, ...)
