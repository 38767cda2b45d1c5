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
from omegaconf import DictConfig, OmegaConf

from kvbench.harness.front.schemas import register_configs
from kvbench.harness.errors import ConfigError
from kvbench.harness.results import atomic_write
from kvbench.harness.untrusted import own_subfolder
from kvbench.harness.job.gpu_slots import pin_gpu_for_launcher, register_gpu_count_resolver
from kvbench.harness.measure.fingerprint import register_slug_resolver
from kvbench.harness.job.summary import print_summary
from kvbench.harness.front.portable import portable
from kvbench.harness.front.sweeper import job_outcome_value, register_sweep_folder_resolver
from kvbench.harness.paths import CONF_DIR

register_configs()
register_slug_resolver()
register_gpu_count_resolver()
register_sweep_folder_resolver()




def write_hydra_record(folder: Path, task_cfg: DictConfig, hydra_cfg) -> None:
    """``<folder>/.hydra/`` (config.yaml, hydra.yaml, overrides.yaml), as Hydra's own run would write it.

    conf/config.yaml sets ``hydra.output_subdir: null``: Hydra would write these before the
    task runs, into a folder that may hold another job (which the run then refuses, or, in a
    changed sweep, leaves for the folder its identity names). Here they go in once the folder
    is the job's, without the machine's paths (harness/front/portable.py): the folder may be published.
    """
    out = own_subfolder(folder, ".hydra")  # a link planted there is refused: nothing is written where it points
    hydra_node = portable({"hydra": OmegaConf.to_container(hydra_cfg, resolve=False)})
    for name, node in (("config.yaml", portable(task_cfg)), ("hydra.yaml", hydra_node),
                       ("overrides.yaml", portable(list(hydra_cfg.overrides.task)))):
        atomic_write(out / name, lambda tmp, node=node: OmegaConf.save(node, tmp, resolve=False))


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base=None)
def main(cfg: DictConfig) -> dict:
    from kvbench.harness.front.compose_errors import CONFIG_ERROR_CODE, write_failed_job
    from kvbench.harness.front.job import run_job

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    sweep_dir = Path(str(hydra_cfg.sweep.dir)).resolve() if hydra_cfg.mode == RunMode.MULTIRUN else None
    try:
        pin_gpu_for_launcher(cfg)  # before anything touches CUDA in this process
    except ConfigError as e:
        rows, code = [write_failed_job(run_dir, str(e), [], cfg)], CONFIG_ERROR_CODE
    else:
        rows, code = run_job(cfg, run_dir, sweep_dir=sweep_dir,
                             on_claimed=lambda folder: write_hydra_record(folder, cfg, hydra_cfg))
    print_summary(rows, run_dir)
    # A single run reports failure by exit code; in a multirun sweep the job returns
    # normally so the launcher goes on, and the sweeper sums up the outcomes.
    if code and HydraConfig.get().mode != RunMode.MULTIRUN:
        sys.exit(code)
    return job_outcome_value(run_dir, rows, code)
