"""A job whose config Hydra cannot compose (``batch=abc``, ``model=nope``, ``foo=1``) still gets a row.

Hydra raises these while composing, before the task function runs, as several lines
of text and exit code 1. Here they become what every other bad value gives: a one-line
``ConfigError`` message, an error row in the job's folder, and exit code 2. The sweeper
(harness/front/sweeper.py) calls this for each job of a sweep, the entry point
(harness/__main__.py) for a single run.
"""

from __future__ import annotations

import difflib
import re
import sys

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

CONFIG_ERROR_CODE = 2
# Override keys that name a row identifier: a group choice or a top-level value.
_IDENTIFIER_KEYS = {"scenario": "scenario", "impl": "impl", "model": "model", "workload": "workload",
                    "dtype": "dtype", "batch": "batch", "block_size": "block_size", "seed": "seed",
                    "max_seq_len": "max_seq_len", "repeat": "repeat", "scenario.name": "scenario",
                    "impl.name": "impl", "model.name": "model", "workload.name": "workload"}


def _first_line(text: str) -> str:
    return next((line.strip() for line in str(text).splitlines() if line.strip()), "")


# The config groups with no option chosen by default (conf/config.yaml): a key of any other
# group sets a key of its default option, which Hydra handles.
UNCHOSEN_BY_DEFAULT = ("gpu", "impl", "engine")


def _unchosen_group_key(overrides: list[str]) -> str | None:
    """``gpu.count=2`` with no ``gpu=NAME`` (gpu and impl have no option by default): the one line for it.

    Hydra fails such an override with a bare ``AssertionError: Unexpected type for root: NoneType``.
    """
    from kvbench.harness.paths import CONF_DIR

    chosen = {o.lstrip("+~").partition("=")[0] for o in overrides}
    for override in overrides:
        key = override.lstrip("+~").partition("=")[0]
        group = key.partition(".")[0]
        if "." in key and group in UNCHOSEN_BY_DEFAULT and group not in chosen:
            plus = "+" if group == "impl" else ""  # impl is in no defaults list (conf/config.yaml)
            options = ", ".join(sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")))
            return (f"{override.lstrip('+~')} sets a key of {group}, but no {group} is chosen; "
                    f"choose one with {plus}{group}=NAME (allowed: {options})")
    return None


def _oversized_integer(overrides: list[str]) -> str | None:
    """An override with more digits in a row than Python converts to an int (4300 by default): the one line for it.

    Hydra's parser fails such a value with a bare ValueError that advises ``sys.set_int_max_str_digits()``."""
    limit = getattr(sys, "get_int_max_str_digits", lambda: 4300)()
    for override in overrides:
        key, sep, value = override.lstrip("+~").partition("=")
        digits = max((len(run) for run in re.findall(r"\d+", value)), default=0)
        if sep and digits > limit:
            shown = value if len(value) <= 24 else f"{value[:12]}...{value[-4:]}"
            return (f"{key}={shown} is a number of {digits} digits, out of range: an integer key is at most "
                    f"9223372036854775807 (int64)")
    return None


def describe(exc: BaseException, overrides: list[str] = ()) -> str:
    """Hydra's or OmegaConf's composition error as one line naming the override or key."""
    from hydra.errors import MissingConfigException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

    from kvbench.harness.front.strict import unknown_key_message

    if isinstance(exc, AssertionError) and (message := _unchosen_group_key(list(overrides))):
        return message
    if isinstance(exc, ValueError) and (message := _oversized_integer(list(overrides))):
        return message
    if isinstance(exc, MissingConfigException) and exc.missing_cfg_file and exc.options is not None:
        missing = exc.missing_cfg_file  # model/meta-llama/Llama-3.1-8B: the group is the first part; hydra/launcher/x
        group, _, name = missing.rpartition("/") if missing.startswith("hydra/") else missing.partition("/")
        allowed = f"allowed: {', '.join(exc.options)}"
        if group == "model" and "/" in name:  # meta-llama/Llama-3.1-8B: a hub name
            return (f"model={name} is a Hugging Face hub name, and kvbench never downloads: point model.path= "
                    f"at a local folder (config.json + safetensors), or choose a model config ({allowed})")
        close = difflib.get_close_matches(name, list(exc.options), n=1, cutoff=0.6)
        hint = f"; did you mean {group}={close[0]}?" if close else ""
        return f"{group}={name} is unknown (no {exc.missing_cfg_file}.yaml on the config path); {allowed}{hint}"
    cause = exc.__cause__ if isinstance(exc.__cause__, OmegaConfBaseException) else None
    if isinstance(exc, OmegaConfBaseException):
        cause = exc
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and getattr(cause, "full_key", None):
        # object_type: the node's dataclass, e.g. the chosen scenario's, whose keys the message lists
        return unknown_key_message(cause.full_key, owner=getattr(cause, "object_type", None))
    head = _first_line(exc)
    if cause is not None:
        # "Error merging override batch=abc" + "Value 'abc' of type 'str' could not be converted to Integer"
        head = head.removeprefix("Error merging override ")
        return f"{head}: {_first_line(cause)}" if head and cause is not exc else _first_line(cause)
    return head or type(exc).__name__


def override_identifiers(overrides: list[str]) -> dict:
    """Row identifiers that a job's overrides name, as given (``batch=abc`` -> batch 'abc')."""
    found = {}
    for override in overrides:
        key, sep, value = override.lstrip("+~").partition("=")
        if sep and key in _IDENTIFIER_KEYS:
            found[_IDENTIFIER_KEYS[key]] = value
    return found


def base_identifiers(task_cfg: DictConfig | None) -> dict:
    """Identifiers of the config the job's overrides were applied to (before they failed)."""
    if task_cfg is None:
        return {}

    def get(key):
        try:
            return OmegaConf.select(task_cfg, key, default=None, throw_on_missing=False)
        except Exception:  # noqa: BLE001 - an unresolvable interpolation: no identifier, not a crash
            return None

    return {"scenario": get("scenario.name"), "impl": get("impl.name"), "model": get("model.name"),
            "dtype": get("dtype"), "batch": get("batch"), "block_size": get("block_size"),
            "seed": get("seed"), "workload": get("workload.name")}


def write_failed_job(run_dir: Path, message: str, overrides: list[str], base: DictConfig | None = None) -> dict:
    """The error row of a job that did not compose, written into ``run_dir``; returns it."""
    from kvbench.harness.results import measured_at, run_id, write_run

    row = {"run_id": run_id(run_dir), **base_identifiers(base), **override_identifiers(overrides),
           "measured_at": measured_at(), "status": "error", "error": f"ConfigError: {message}"}
    write_run(run_dir, [row])
    return row
