"""``python -m harness.replay RUN_DIR [--out DIR]``: run a finished run again from its saved config.

The run folder's config.yaml is the resolved config, so the replay needs nothing
else: same workload, same seeds, same impls. On the same device it generates the same
tokens (the workload and output digests match); elsewhere, its rows say what differs.
Each new row names the run it re-ran (``replay_of``) and the environment fields that
differ from the original's env.json (``fingerprint_diff``). The replay goes into
``--out``, by default ``runs/replay/<date>/<time>`` (outside results/, so a replay
never joins the published report unless you put it there).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from harness.config import Config, ScenarioConfig
from harness.front.schemas import register_configs
from harness.scenarios import schemas
from harness.errors import ConfigError
from harness.measure.fingerprint import Fingerprint, collect
from harness.results import FINGERPRINT, run_id
from harness.job.folder import read_table


def load_config(run_dir: Path) -> Config:
    """The run's saved config, as a fresh (not resuming) job."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"{run_dir} has no config.yaml; RUN_DIR must be a kvbench run folder")
    try:
        saved = OmegaConf.load(path)
        # The scenario's own dataclass, which the saved keys are merged over (as scenario=NAME composes it).
        scenario = schemas().get(str(OmegaConf.select(saved, "scenario.name", default="")), ScenarioConfig)
        cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config(scenario=scenario())), saved))
    except OmegaConfBaseException as e:
        raise ConfigError(f"{path} does not match this kvbench's config schema: {e}".splitlines()[0]) from None
    cfg.resume = False
    return cfg


def fingerprint_diff(original: dict, now: Fingerprint) -> str | None:
    """``key: old -> new`` for each environment field that changed; None when none did."""
    new = now.as_dict()
    diffs = [f"{k}: {original.get(k)} -> {new[k]}" for k in FINGERPRINT
             if k in new and str(original.get(k)) != str(new[k])]
    return "; ".join(diffs) or None


def _digests(rows) -> dict:
    return {r.get("impl"): (r.get("workload_digest"), r.get("output_digest")) for r in rows}


def replay(run_dir: Path, out: Path) -> tuple[list[dict], int]:
    from harness.front.job import run_job

    cfg = load_config(run_dir)
    try:
        original_env = json.loads((run_dir / "env.json").read_text())
    except (OSError, ValueError):
        original_env = {}  # the diff then lists every field: nothing is known to match
    diff = fingerprint_diff(original_env, collect(cfg.device.name))
    rows, code = run_job(cfg, out, extra={"replay_of": run_id(run_dir), "fingerprint_diff": diff})
    before = read_table(run_dir / "rows")
    before = _digests(before.to_dict("records")) if before is not None else {}
    for impl, (workload, output) in _digests(rows).items():
        if impl in before:
            same = ["same" if a == b else "different" for a, b in zip((workload, output), before[impl])]
            print(f"{impl}: workload digest {same[0]}, output digest {same[1]}")
    print(f"environment: {diff or 'no field differs'}")
    return rows, code


def main(argv: list[str] | None = None) -> int:
    from harness.job.summary import print_summary

    parser = argparse.ArgumentParser(prog="python -m harness.replay", description="run a finished run again from its saved config")
    parser.add_argument("run_dir", type=Path, help="a finished run folder (holds config.yaml)")
    parser.add_argument("--out", type=Path, default=None,
                        help="where the replay goes (default runs/replay/<date>/<time>)")
    args = parser.parse_args(argv)
    out = args.out or Path("runs/replay") / datetime.now().strftime("%Y-%m-%d/%H-%M-%S")
    register_configs()
    try:
        rows, code = replay(args.run_dir, out)
    except ConfigError as e:
        print(f"kvbench: replay: {e}", file=sys.stderr)
        return 2
    print_summary(rows, out)
    return code


if __name__ == "__main__":
    sys.exit(main())
