"""``python -m harness.replay RUN_DIR [--out DIR]``: run a finished run again from its saved config.

The run folder's config.yaml is the resolved config, so the replay needs nothing
else: same workload, same seeds, same impls. On the same device it generates the same
tokens (the workload and output digests match); elsewhere, its rows say what differs.
Each new row names the run it re-ran (``replay_of``) and the environment fields that
differ from the original's env.json (``fingerprint_diff``). The replay goes into
``--out``, by default ``runs/replay/<date>/<time>`` (outside results/, so a replay
never joins the published report unless you put it there).

A results folder is data, shared and committed, so replay trusts none of it to run:
- ``config.yaml`` is loaded as plain YAML and never resolved: a saved config is already
  resolved, so any ``${...}`` interpolation (``${oc.env:SECRET}`` would copy a secret into
  the replay's rows) is refused with one line;
- an ``impl.kernel`` that is not one of kvbench's own (a module's dotted path, which would be
  imported and its top-level code run) is refused unless ``--allow-kernel MODULE`` names it;
- every load error (no file, bad YAML, not a mapping, a key this schema lacks) is one line.
"""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from kvbench.harness.config import Config, ScenarioConfig
from kvbench.harness.front.schemas import register_configs
from kvbench.harness.scenarios import schemas
from kvbench.harness.errors import ConfigError
from kvbench.harness.measure.fingerprint import Fingerprint, collect
from kvbench.harness.paths import REPO_ROOT
from kvbench.harness.results import FINGERPRINT, run_id
from kvbench.harness.job.folder import read_table
from kvbench.harness.untrusted import RECORD_LIMIT, UntrustedError, read_json, read_yaml


def builtin_kernel(name: str) -> bool:
    """A kernel of kvbench's own: a registry name, or a module of this checkout's kernels/ package."""
    from kvbench.kernels.registry import KERNELS

    if name in KERNELS:
        return True
    parts = name.split(".")
    return (len(parts) > 1 and parts[0] == "kernels" and all(part.isidentifier() for part in parts)
            and (REPO_ROOT / Path(*parts).with_suffix(".py")).is_file())


def _interpolations(node: Any, at: str = "") -> list[str]:
    """The keys of a plain (unresolved) container whose value holds an interpolation ``${...}``."""
    if isinstance(node, dict):
        return [k for key, value in node.items() for k in _interpolations(value, f"{at}{key}.")]
    if isinstance(node, list):
        return [k for i, value in enumerate(node) for k in _interpolations(value, f"{at}{i}.")]
    return [at.rstrip(".")] if isinstance(node, str) and "${" in node else []


def _saved(path: Path) -> dict:
    """``config.yaml`` as plain data: YAML, a mapping, with nothing to resolve; else one line. Read as untrusted
    data (harness/untrusted): a regular file in the run folder, size and alias limits (a 1 KB alias bomb is
    refused before anything walks it)."""
    try:
        data = read_yaml(path, root=path.parent)
    except UntrustedError as e:
        raise ConfigError(str(e)) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} holds {type(data).__name__}, not a kvbench config (a mapping of keys)")
    if found := _interpolations(data):
        raise ConfigError(f"{path}: {found[0]} is an interpolation (${{...}}); a saved config is already resolved, "
                          "so replay resolves nothing (it could read your environment); write the value itself")
    return data


def upgraded(data: dict) -> dict:
    """A config saved by an older kvbench, in today's keys, meaning the same: ``gpu.memory_gb`` (decimal GB, before
    roofline v5) becomes the ``gpu.memory_mib`` of the same bytes, so a replay prices the memory the run priced; the
    GPU's ``step_overhead_us`` and ``layer_overhead_us`` (before v6) become an engine of those figures."""
    gpu = data.get("gpu")
    if isinstance(gpu, dict) and "memory_gb" in gpu and "memory_mib" not in gpu:
        gb = gpu.pop("memory_gb")
        gpu["memory_mib"] = None if gb is None else float(gb) * 1e9 / 2**20
    if isinstance(gpu, dict) and "step_overhead_us" in gpu and data.get("engine") is None:
        # Before roofline v6 the GPU file held the host's costs: the same prices from an engine of those figures
        # (in series, nothing per sequence or request), the run's chunked_prefill as it ran.
        data["engine"] = {"name": "vllm_v1", "step_overhead_us": gpu.pop("step_overhead_us"),
                          "layer_overhead_us": gpu.pop("layer_overhead_us", 0.0), "seq_overhead_us": 0.0,
                          "frontend_ms": 0.0, "async_scheduling": False, "scheduler_steps": 1,
                          "chunked_prefill": bool(data.get("chunked_prefill"))}
    if isinstance(gpu, dict):  # before v8 a prefill's floor of weight reads; the engine's gemm_knee replaced it
        gpu.pop("prefill_weight_multiple", None)
    return data


def load_config(run_dir: Path, allow_kernels: tuple[str, ...] = ()) -> Config:
    """The run's saved config, as a fresh (not resuming) job; ``allow_kernels``: kernel modules it may import."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"{run_dir} has no config.yaml; RUN_DIR must be a kvbench run folder")
    data = upgraded(_saved(path))
    kernel = (data.get("impl") or {}).get("kernel") if isinstance(data.get("impl"), dict) else None
    if kernel is not None and not builtin_kernel(str(kernel)) and str(kernel) not in allow_kernels:
        raise ConfigError(f"{path}: impl.kernel={kernel!r} is not one of kvbench's kernels; replaying it would "
                          f"import that module and run its code: pass --allow-kernel {kernel} if you trust it")
    try:
        saved = OmegaConf.create(data)
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


def replay(run_dir: Path, out: Path, allow_kernels: tuple[str, ...] = ()) -> tuple[list[dict], int]:
    from kvbench.harness.front.job import run_job

    cfg = load_config(run_dir, allow_kernels)
    try:
        original_env = read_json(run_dir / "env.json", RECORD_LIMIT, root=run_dir)
    except UntrustedError:
        original_env = {}  # the diff then lists every field: nothing is known to match
    if not isinstance(original_env, dict):
        original_env = {}
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


def main(argv: list[str] | None = None) -> int | str | None:
    """The command: one line and exit 2 for a bad argument or saved config; 141, quietly, when stdout's reader
    went away (harness/console.py)."""
    from kvbench.harness.console import USAGE_ERROR, OneLineParser, quiet_when_closed, unwritable
    from kvbench.harness.job.summary import print_summary

    def command() -> int:
        parser = OneLineParser(prog="python -m harness.replay", description="run a finished run again from its saved config")
        parser.add_argument("run_dir", type=Path, help="a finished run folder (holds config.yaml)")
        parser.add_argument("--out", type=Path, default=None,
                            help="where the replay goes (default runs/replay/<date>/<time>)")
        parser.add_argument("--allow-kernel", action="append", default=[], metavar="MODULE",
                            help="a kernel module (dotted path) the saved config names that replay may import and run")
        args = parser.parse_args(argv)
        out = args.out or Path("runs/replay") / datetime.now().strftime("%Y-%m-%d/%H-%M-%S")
        if (why := unwritable(out)) is not None:  # before the run, which writes its rows there
            print(f"kvbench: replay: --out {out} cannot hold the replay ({why}); choose a writable folder",
                  file=sys.stderr)
            return USAGE_ERROR
        register_configs()
        try:
            rows, code = replay(args.run_dir, out, tuple(args.allow_kernel))
        except ConfigError as e:
            print(f"kvbench: replay: {e}", file=sys.stderr)
            return USAGE_ERROR
        print_summary(rows, out)
        return code

    return quiet_when_closed(command)


if __name__ == "__main__":
    sys.exit(main())
