"""Strict checks on the composed config that Hydra itself lets through.

Hydra applies ``+key=value`` inside ``open_dict``, so a key the schema does not know
(``+workload.promptlen=5``, the form Hydra's own hint suggests for a typo) reaches the
job, and ``OmegaConf.to_object`` then drops it without a word. ``model.name=X`` only
relabels the rows: the shapes stay those of the chosen ``model=`` option. Both are
errors here, each a one-line ``ConfigError`` naming the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from harness.config import Config
from harness.errors import ConfigError

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def _dataclass_of(hint) -> type | None:
    """The dataclass behind a field's type (``ImplConfig`` for ``Optional[ImplConfig]``), else None."""
    if dataclasses.is_dataclass(hint):
        return hint
    for arg in typing.get_args(hint):
        if dataclasses.is_dataclass(arg):
            return arg
    return None


def unknown_key_message(full_key: str, schema: type = Config) -> str:
    """``workload.promptlen is not a config key; did you mean workload.prompt_len? ...``"""
    *parents, leaf = full_key.split(".")
    owner = schema
    for part in parents:  # walk to the dataclass that should hold ``leaf``
        field = {f.name: f for f in dataclasses.fields(owner)}.get(part)
        owner = _dataclass_of(typing.get_type_hints(owner).get(part)) if field else None
        if owner is None:
            return f"{full_key} is not a config key"
    names = [f.name for f in dataclasses.fields(owner)]
    prefix = ".".join(parents) + "." if parents else ""
    close = difflib.get_close_matches(leaf, names, n=1, cutoff=0.6)
    hint = f"; did you mean {prefix}{close[0]}?" if close else ""
    where = f"{'.'.join(parents)} keys" if parents else "top-level keys"
    return f"{full_key} is not a config key{hint} ({where}: {', '.join(names)})"


def _unknown_keys(node: dict, schema: type, prefix: str = "") -> list[str]:
    hints = typing.get_type_hints(schema)
    found = []
    for key, value in node.items():
        if key not in hints:
            found.append(f"{prefix}{key}")
        elif isinstance(value, dict) and (inner := _dataclass_of(hints[key])) is not None:
            found += _unknown_keys(value, inner, f"{prefix}{key}.")
    return found


def check_known_keys(cfg: DictConfig, schema: type = Config) -> None:
    """Every key of the composed config is a field of its schema dataclass."""
    # Without resolving: an interpolation is checked by its key, not its value.
    plain = OmegaConf.to_container(cfg, resolve=False, throw_on_missing=False)
    plain.pop("hydra", None)  # present when a caller composed with return_hydra_config
    unknown = _unknown_keys(plain, schema)
    if unknown:
        raise ConfigError(unknown_key_message(unknown[0], schema))


def hydra_choice(group: str) -> str | None:
    """The option chosen for a config group in the running Hydra app; None outside one."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get().runtime.choices.get(group)
    except ValueError:  # not inside a Hydra app (a test composing by itself)
        return None


def _model_options() -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))


def check_model_name(cfg: DictConfig, choice: str | None) -> None:
    """``model.name`` must be the chosen ``model=`` option's own name (unless ``model.path`` names a folder).

    ``choice`` is Hydra's choice for the model group; None (not known) skips the check.
    """
    if choice is None or OmegaConf.select(cfg, "model.path", default=None):
        return
    option = CONF_DIR / "model" / f"{choice}.yaml"
    if not option.is_file():  # an option from another config source: its name is its own business
        return
    expected = OmegaConf.load(option).get("name", choice)
    name = OmegaConf.select(cfg, "model.name", default=None)
    if name == expected:
        return
    options = _model_options()
    how = (f"choose it with model={name}" if name in options
           else f"choose a model with model=NAME (allowed: {', '.join(options)}) or model.path=DIR")
    raise ConfigError(f"model.name={name!r} only relabels the rows (the shapes stay those of model={choice}); {how}")
