"""``python -m harness.sweep_check conf/sweep/NAME.yaml ...``: every job of a sweep composes and validates.

The GPU check runs this on a CPU machine (``DRY=1``) so that a sweep config broken by a
rename or a typo is found in seconds, not in the first minutes of a rare GPU lease.
Each sweep is composed as ``python -m harness -m +sweep=NAME`` would compose it, once per
combination of its sweeper values, and the result goes through the same validation as a
run (``harness.resolve.validate``), with the device forced to what this machine has.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

from omegaconf import OmegaConf


CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def sweep_jobs(path: Path) -> list[list[str]]:
    """The override lists of every job of the sweep file ``path`` (cartesian product of its params)."""
    raw = OmegaConf.load(path)
    params = OmegaConf.select(raw, "hydra.sweeper.params", default=None) or {}
    axes = [[f"{key}={v.strip()}" for v in str(values).split(",")] for key, values in params.items()]
    base = [f"+sweep={path.stem}"]
    return [base + list(combo) for combo in itertools.product(*axes)]


def check(paths: list[Path], extra: list[str] | None = None) -> int:
    """Compose and validate every job of each sweep (plus ``extra`` overrides); returns the failures."""
    from hydra import compose, initialize_config_dir

    from harness.config import register_configs
    from harness.resolve import resolve

    register_configs()
    failures = 0
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        for path in paths:
            jobs = sweep_jobs(path)
            for overrides in jobs:
                try:
                    cfg = compose("config", overrides=[*overrides, "device=auto", *(extra or [])])
                    resolve(cfg)
                except Exception as e:  # noqa: BLE001 - a ConfigError or a Hydra error: report every job
                    failures += 1
                    print(f"FAIL {' '.join(overrides)}: {type(e).__name__}: {e}")
            print(f"{path.name}: {len(jobs)} jobs compose")
    return failures


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv]
    missing = [str(p) for p in paths if not p.is_file()]
    if not paths or missing:
        print(f"usage: python -m harness.sweep_check conf/sweep/NAME.yaml ... (missing: {missing})", file=sys.stderr)
        return 2
    return 1 if check(paths) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
