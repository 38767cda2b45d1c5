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

from omegaconf import MISSING, DictConfig, OmegaConf

from kvbench.harness.config import Config
from kvbench.harness.errors import ConfigError
from kvbench.harness.paths import CONF_DIR



def _dataclass_of(hint) -> type | None:
    """The dataclass behind a field's type (``ImplConfig`` for ``Optional[ImplConfig]``), else None."""
    if dataclasses.is_dataclass(hint):
        return hint
    for arg in typing.get_args(hint):
        if dataclasses.is_dataclass(arg):
            return arg
    return None


def _declared(schema: type, parents: list[str]) -> type | None:
    """The dataclass the schema declares at ``parents`` (``ScenarioConfig`` for ``scenario``), else None."""
    owner = schema
    for part in parents:
        field = {f.name: f for f in dataclasses.fields(owner)}.get(part)
        owner = _dataclass_of(typing.get_type_hints(owner).get(part)) if field else None
        if owner is None:
            return None
    return owner


def _option(schema: type) -> str | None:
    """The group option a subclass schema stands for: its ``name`` default (``KernelScenario``: kernel)."""
    field = {f.name: f for f in dataclasses.fields(schema)}.get("name")
    return field.default if field is not None and isinstance(field.default, str) and field.default != MISSING else None


def _subclasses(schema: type) -> list[type]:
    found = []
    for sub in schema.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def unknown_key_message(full_key: str, schema: type = Config, owner: type | None = None) -> str:
    """``workload.promptlen is not a config key; did you mean workload.prompt_len? ...``

    ``owner`` is the dataclass that lacks the key when it is more than the schema declares
    there: the chosen scenario's (``KernelScenario`` for ``scenario``), whose keys are listed,
    with the scenarios the key belongs to.
    """
    *parents, leaf = full_key.split(".")
    declared = _declared(schema, parents)
    if declared is None:
        return f"{full_key} is not a config key"
    if owner is None or not (dataclasses.is_dataclass(owner) and issubclass(owner, declared)):
        owner = declared
    names = [f.name for f in dataclasses.fields(owner)]
    prefix = ".".join(parents) + "." if parents else ""
    close = difflib.get_close_matches(leaf, names, n=1, cutoff=0.6)
    hint = f"; did you mean {prefix}{close[0]}?" if close else ""
    where = f"{'.'.join(parents)} keys" if parents else "top-level keys"
    option = _option(owner) if owner is not declared else None
    if option is None:
        return f"{full_key} is not a config key{hint} ({where}: {', '.join(names)})"
    group = ".".join(parents)
    others = sorted({o for sub in _subclasses(declared)
                     if (o := _option(sub)) and o != option and leaf in {f.name for f in dataclasses.fields(sub)}})
    belongs = f"belongs to {group}={', '.join(others)}, not {group}={option}" if others else "is not a config key"
    return f"{full_key} {belongs}{hint} ({group}={option} keys: {', '.join(names)})"


def _child_schema(node: DictConfig, key: str, hint) -> type | None:
    """The dataclass of ``node[key]``: the one it was merged as (a scenario's own), else the declared one."""
    declared = _dataclass_of(hint)
    if declared is None or OmegaConf.is_interpolation(node, key) or OmegaConf.is_missing(node, key):
        return None
    actual = OmegaConf.get_type(node, key)
    if actual is None or not OmegaConf.is_dict(node[key]):  # a None value (no impl), or not a node
        return None
    return actual if dataclasses.is_dataclass(actual) and issubclass(actual, declared) else declared


def _unknown_keys(node: DictConfig, schema: type, prefix: str = "", skip: tuple[str, ...] = ()) -> list[tuple[str, type]]:
    """(key, the dataclass that lacks it) for each key of ``node`` that its schema does not know."""
    hints = typing.get_type_hints(schema)
    found = []
    for key in node.keys():
        if key in skip:
            continue
        if key not in hints:
            found.append((f"{prefix}{key}", schema))
        elif (inner := _child_schema(node, key, hints[key])) is not None:
            found += _unknown_keys(node[key], inner, f"{prefix}{key}.")
    return found


def check_known_keys(cfg: DictConfig, schema: type = Config) -> None:
    """Every key of the composed config is a field of its schema dataclass (the chosen scenario's, for ``scenario``)."""
    # Without resolving a value: an interpolation is checked by its key, not its value. ``hydra``
    # is there when a caller composed with return_hydra_config.
    unknown = _unknown_keys(cfg, schema, skip=("hydra",))
    if unknown:
        key, owner = unknown[0]
        raise ConfigError(unknown_key_message(key, schema, owner))


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
