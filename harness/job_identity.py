"""A job's identity: what it measures, as a short hash that resume and the run folder's guard compare.

Two runs are the same job when their resolved configs agree on everything that
changes a result, on the same kind of device. Output paths are not in the config
(Hydra holds them), and the switches below change how a job runs, not what it
measures, so a resumed job keeps the identity of the attempt it continues.

Only the values that differ from the schema's defaults enter the hash: a key added to
the schema later, with a default that keeps the old behaviour, leaves every existing
job id (and so every published results folder) valid.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from harness.config import Config

# Keys of the resolved config that leave the results unchanged.
NOT_IDENTITY = ("resume", "progress")

_NO_DEFAULT = object()  # a field without a default: always part of the identity


def _class_default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return _NO_DEFAULT


def _non_default(obj: Any, default: Any) -> dict:
    """The fields of dataclass ``obj`` whose values differ from their defaults, recursively.

    A field's default is the one ``default`` (the default the enclosing schema gives ``obj``)
    holds, when ``default`` has that field; otherwise ``obj``'s own class default. So a chosen
    scenario (a DecodeScenario where the schema's default is the base ScenarioConfig, whose
    ``name`` is MISSING) keeps its ``name``, and its own keys count only when changed.
    """
    base = {f.name for f in dataclasses.fields(default)} if dataclasses.is_dataclass(default) else set()
    out = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        want = getattr(default, f.name) if f.name in base else _class_default(f)
        if dataclasses.is_dataclass(value):
            nested = _non_default(value, want)
            # Omitted only when it is the default's own class with nothing changed: a
            # dataclass where the default is None, or of another class, is a choice.
            if nested or type(value) is not type(want):
                out[f.name] = nested
        elif want is _NO_DEFAULT or value != want:
            out[f.name] = value
    return out


def identity_fields(cfg: Config, device_slug: str) -> dict:
    fields = {k: v for k, v in _non_default(cfg, None).items() if k not in NOT_IDENTITY}
    return {"config": fields, "device_slug": device_slug}


def job_id(cfg: Config, device_slug: str) -> str:
    """16 hex digits of the SHA-256 of the resolved config's non-default values (less
    NOT_IDENTITY) and the device slug."""
    text = json.dumps(identity_fields(cfg, device_slug), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
