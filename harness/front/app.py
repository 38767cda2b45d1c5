"""The Hydra app: the task function every job runs, in a module that launchers can import.

Kept out of ``__main__`` because the joblib and submitit launchers pickle the task
function into other processes: a function of ``__main__`` travels by value, without the
resolvers registered below, and the sweep folders' ``${kvbench_slug:}`` would not resolve there.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from harness.front.schemas import register_configs
from harness.errors import ConfigError
from harness.job.gpu_slots import pin_gpu_for_launcher, register_gpu_count_resolver
from harness.measure.fingerprint import register_slug_resolver
from harness.job.summary import print_summary
from harness.front.sweeper import job_outcome_value, register_sweep_folder_resolver
from harness.paths import CONF_DIR

register_configs()
register_slug_resolver()
register_gpu_count_resolver()
register_sweep_folder_resolver()




@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base=None)
def main(cfg: DictConfig) -> dict:
    from harness.front.compose_errors import CONFIG_ERROR_CODE, write_failed_job
    from harness.front.job import run_job

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        pin_gpu_for_launcher(cfg)  # before anything touches CUDA in this process
    except ConfigError as e:
        rows, code = [write_failed_job(run_dir, str(e), [], cfg)], CONFIG_ERROR_CODE
    else:
        rows, code = run_job(cfg, run_dir)
    print_summary(rows, run_dir)
    # A single run reports failure by exit code; in a multirun sweep the job returns
    # normally so the launcher goes on, and the sweeper sums up the outcomes.
    if code and HydraConfig.get().mode != RunMode.MULTIRUN:
        sys.exit(code)
    return job_outcome_value(run_dir, rows, code)
