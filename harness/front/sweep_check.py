"""``python -m harness.front.sweep_check conf/sweep/NAME.yaml ... [key=values ...]``: every job of a sweep composes and validates.

The GPU check runs this on a CPU machine (``DRY=1``) so that a sweep config broken by a
rename or a typo is found in seconds, not in the first minutes of a rare GPU lease.
Each sweep is composed as ``python -m harness -m +sweep=NAME`` would compose it, once per
combination of its sweeper values (and of the ``key=values`` given after the files, as they
would be on the sweep's command line), and the result goes through the same validation as a
run (``harness.front.validate.validate``), with the device forced to what this machine has (and, on
a machine without a GPU, the GPU-only switches off: ``GPU_ONLY``). The
folder each sweep writes to (``hydra.sweep.dir``) is resolved too.
"""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import OmegaConf


from kvbench.harness.paths import CONF_DIR


def sweep_jobs(path: Path, overrides: list[str] | None = None) -> list[list[str]]:
    """The override lists of every job of the sweep file ``path``, with ``overrides`` given on the
    command line after it (``batch=1,64`` replaces the file's batch values), as kvbench's sweeper
    expands them (harness/front/sweeper.py: the cartesian product of the values, ``first`` patterns first)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from kvbench.harness.front.sweeper import expand

    raw = OmegaConf.load(path)
    params = OmegaConf.select(raw, "hydra.sweeper.params", default=None) or {}
    given = [f"{key}={values}" for key, values in params.items()] + list(overrides or [])
    parsed = OverridesParser.create().parse_overrides(given)
    first = OmegaConf.select(raw, "hydra.sweeper.first", default=None) or []
    base = [f"+sweep={path.stem}"]
    return [base + job for batch in expand(parsed, None, list(first)) for job in batch]


# Switches that only validate on a GPU, and their value elsewhere: on a CPU machine a GPU sweep's
# job is checked with them off (it still composes with the sweep's value; the rest validates).
GPU_ONLY = {"cuda_graph": "false"}


def on_this_machine(job: list[str], has_gpu: bool) -> list[str]:
    """``job`` as this machine can validate it: without a GPU, the GPU-only switches are off."""
    if has_gpu:
        return job
    return [_gpu_off(o) for o in job]


def _gpu_off(override: str) -> str:
    """A GPU-only switch's override with its off value, written as given (``key=``, ``+key=`` or ``++key=``)."""
    if "=" not in override:
        return override
    written = override.split("=", 1)[0]
    key = written.lstrip("+")
    return f"{written}={GPU_ONLY[key]}" if key in GPU_ONLY else override


def _one_line(exc: Exception) -> str:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from kvbench.harness.front.compose_errors import describe

    if isinstance(exc, (HydraException, OmegaConfBaseException)):
        return describe(exc)  # Hydra's several lines, as a run would report them
    return f"{type(exc).__name__}: {exc}"


def sweep_dir(path: Path) -> str:
    """Where the sweep file ``path`` writes its jobs (hydra.sweep.dir, resolved on this machine)."""
    from hydra import compose

    cfg = compose("config", overrides=[f"+sweep={path.stem}"], return_hydra_config=True)
    return str(cfg.hydra.sweep.dir)


def check(paths: list[Path], extra: list[str] | None = None, overrides: list[str] | None = None,
          order: bool = False) -> int:
    """Compose and validate every job of each sweep (with the command line's sweep ``overrides``, then
    ``extra`` overrides on every job), and resolve where it writes; returns the failures. ``order``:
    also print each job, in the order the sweep runs them."""
    from hydra import compose, initialize_config_dir

    from kvbench.harness.front.schemas import register_configs
    from kvbench.harness.measure.fingerprint import register_slug_resolver
    from kvbench.harness.front.resolve import resolve
    from kvbench.harness.front.sweeper import register_sweep_folder_resolver
    from kvbench.kernels.cuda_available import cuda_available

    register_configs()
    register_slug_resolver()
    register_sweep_folder_resolver()
    failures = 0
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        for path in paths:
            jobs = sweep_jobs(path, overrides)
            for num, job in enumerate(jobs):
                if order:
                    print(f"{path.name} job {num}: {' '.join(job[1:])}")
                try:
                    runnable = on_this_machine(job, cuda_available())
                    if runnable != job:
                        compose("config", overrides=[*job, "device=auto", *(extra or [])])  # as the sweep gives it
                    resolve(compose("config", overrides=[*runnable, "device=auto", *(extra or [])]))
                except Exception as e:  # noqa: BLE001 - a ConfigError or a Hydra error: report every job
                    failures += 1
                    print(f"FAIL {' '.join(job)}: {_one_line(e)}")
            try:
                where = sweep_dir(path)
            except Exception as e:  # noqa: BLE001 - the output folder does not resolve
                failures += 1
                print(f"FAIL {path.name}: hydra.sweep.dir: {_one_line(e)}")
                where = "?"
            print(f"{path.name}: {len(jobs)} jobs compose, into {where}")
    return failures


def main(argv: list[str]) -> int:
    """``[--order] conf/sweep/NAME.yaml ... [key=values ...]``: the sweeps, then overrides for all of them."""
    order = "--order" in argv
    argv = [a for a in argv if a != "--order"]
    paths = [Path(a) for a in argv if "=" not in a]
    overrides = [a for a in argv if "=" in a]
    missing = [str(p) for p in paths if not p.is_file()]
    if not paths or missing:
        print(f"usage: python -m harness.front.sweep_check [--order] conf/sweep/NAME.yaml ... [key=values ...] (missing: {missing})",
              file=sys.stderr)
        return 2
    return 1 if check(paths, overrides=overrides, order=order) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
