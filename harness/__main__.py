"""``python -m harness [overrides]``: one run (or a sweep with -m) into Hydra's run folder."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from harness.config import register_configs
from harness.measure.fingerprint import register_slug_resolver
from harness.summary import print_summary

register_configs()
register_slug_resolver()


@hydra.main(config_path="../conf", config_name="config", version_base=None)
def main(cfg: DictConfig) -> None:
    from harness.run import run_job

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    rows, code = run_job(cfg, run_dir)
    print_summary(rows, run_dir)
    # A single run reports failure by exit code; in a multirun sweep the job
    # returns normally so Hydra goes on to the next one (the row records it).
    if code and HydraConfig.get().mode != RunMode.MULTIRUN:
        sys.exit(code)


if __name__ == "__main__":
    main()
