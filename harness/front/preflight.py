"""Compose the command line before Hydra does, so that a bad one fails as kvbench's errors do.

Hydra composes a run's config before calling the task function; a type error
(``batch=abc``), an unknown key or an unknown option (``model=nope``) would end the
process with Hydra's several-line message and exit code 1, and leave no row. Composing
it here first (as Hydra will) turns such a failure into one line, an error row in the
folder the run would have had, and exit code 2. So do a number too long for Python to parse
(``batch=`` and 5000 digits: Hydra's bare ValueError) and, in a single run, an interpolation that
does not resolve (``batch=${oc.env:NOPE}``: Hydra resolves it only in the job, as a traceback).
``--cfg`` and ``--info`` compose the same way: a bad override is the same one line, with no row.
A ``-m`` sweep is checked the same way for its shared overrides; the sweeper checks each job
(harness/front/sweeper.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from kvbench.harness.front.compose_errors import CONFIG_ERROR_CODE, describe, write_failed_job
from kvbench.harness.paths import CONF_DIR

CONFIG_NAME = "config"
SHOWN_CONFIGS = ("all", "config", "defaults", "defaults-tree")  # the --info views that compose the overrides


def _placement_overrides(overrides: list[str]) -> list[list[str]]:
    """Override sets that fix where a run writes, most specific first: the hydra.* ones with
    the sweep file (its hydra.sweep.dir), then the hydra.* ones alone."""
    hydra_own = [o for o in overrides if o.lstrip("+~").startswith(("hydra.", "hydra/"))]
    sweep = [o for o in overrides if o.lstrip("+~").startswith("sweep=")]
    return [hydra_own + sweep, hydra_own] if sweep else [hydra_own]


def _run_dir(cfg: DictConfig, multirun: bool) -> Path:
    if not multirun:
        return Path(str(cfg.hydra.run.dir))
    with open_dict(cfg.hydra.job):  # a sweep that cannot compose: its first job's folder
        cfg.hydra.job.num = 0
        cfg.hydra.job.id = f"{cfg.hydra.job.name}_0"
    return Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)


def _failure_place(hydra_app, overrides: list[str], mode, multirun: bool) -> tuple[Path, DictConfig] | None:
    """Where the failed run's row goes, and the config its identifiers come from."""
    for subset in _placement_overrides(overrides):
        try:
            cfg = hydra_app.compose_config(CONFIG_NAME, subset, run_mode=mode, with_log_configuration=False)
            run_dir = _run_dir(cfg, multirun)
        except Exception:  # noqa: BLE001 - the placement itself is broken: try with fewer overrides
            continue
        with open_dict(cfg):
            del cfg["hydra"]
        return run_dir, cfg
    return None


def usable_folder_error(folder: Path) -> str | None:
    """Why ``folder`` cannot hold run folders (a file in its path, read-only, /proc, ...), or None.

    Creates it, as Hydra will next, and writes and removes a probe file in it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".kvbench-probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        return f"{type(e).__name__}: {e.strerror or e}"
    return None


def _unusable_folder(cfg: DictConfig, multirun: bool) -> int | None:
    """None when the run (or sweep) folder can be written; else one line, and exit 2 (no row can be written there)."""
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    try:
        folder = Path(str(cfg.hydra.sweep.dir if multirun else cfg.hydra.run.dir))
    except Exception:  # noqa: BLE001 - an interpolation Hydra resolves only at run time: Hydra's own handling
        return None
    why = usable_folder_error(folder)
    if why is None:
        return None
    print(f"kvbench: run: error: {key}={folder} cannot hold a run folder ({why}); choose a writable folder",
          file=sys.stderr)
    return CONFIG_ERROR_CODE


def unresolvable(cfg: DictConfig) -> str | None:
    """A task key whose interpolation does not resolve (``batch=${oc.env:NOPE}``, ``batch=${nope}``): its one
    line, else None. Hydra composes such a value as written and resolves it only in the job, where the failure
    was a traceback with no row."""
    import copy

    from hydra.core.hydra_config import HydraConfig
    from omegaconf.errors import InterpolationResolutionError

    HydraConfig.instance().set_config(cfg)  # ${hydra:...} resolves as in the job (Hydra sets it again there)
    task = copy.deepcopy(cfg)
    with open_dict(task):
        del task["hydra"]
    try:
        OmegaConf.to_container(task, resolve=True)
    except InterpolationResolutionError as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        return f"{e.full_key}: its interpolation cannot be resolved: {reason}"
    return None


def check_command_line(argv: list[str]) -> int | None:
    """None when Hydra can compose ``argv``; else writes the error row and returns the exit code."""
    from hydra import initialize_config_dir
    from hydra._internal.utils import get_args_parser
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from hydra.types import RunMode
    from omegaconf.errors import OmegaConfBaseException

    from kvbench.harness.front.schemas import register_configs

    register_configs()  # the schema the defaults list names
    args = get_args_parser().parse_args(argv)
    if args.config_dir is not None and not Path(args.config_dir).is_dir():  # Hydra: its message and exit 1
        print(f"kvbench: error: --config-dir {args.config_dir} is not a folder", file=sys.stderr)
        return CONFIG_ERROR_CODE
    if (args.help or args.hydra_help or args.shell_completion or args.config_path or args.config_dir
            or args.config_name or args.experimental_rerun or (args.info and args.info not in SHOWN_CONFIGS)):
        return None  # not a config, or a config source of its own: Hydra's own handling
    # --cfg and --info show the composed config: a bad override is the same one line, but no run, so no row.
    shows = bool(args.cfg or args.info)
    multirun = bool(args.multirun)
    mode = RunMode.MULTIRUN if multirun else RunMode.RUN
    overrides = list(args.overrides)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        hydra_app = GlobalHydra.instance().hydra
        try:
            cfg = hydra_app.compose_config(CONFIG_NAME, overrides, run_mode=mode, with_log_configuration=False)
        except (HydraException, OmegaConfBaseException, AssertionError, ValueError) as e:
            message = describe(e, overrides)  # ValueError: a number Python will not parse (4300+ digits)
        else:  # a sweep's jobs are composed and resolved by the sweeper; --cfg shows values as written
            message = None if multirun or (shows and not args.resolve) else unresolvable(cfg)
            if message is None:
                return None if shows else _unusable_folder(cfg, multirun)
        place = None if shows else _failure_place(hydra_app, overrides, mode, multirun)
    print(f"kvbench: {'config' if shows else 'run'}: error: ConfigError: {message}", file=sys.stderr)
    if place is not None:
        run_dir, base = place
        write_failed_job(run_dir, message, overrides, base)
        print(f"results: {run_dir}")
    return CONFIG_ERROR_CODE

