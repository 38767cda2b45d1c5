"""A job's identity: what it measures, as a short hash that resume and the run folder's guard compare.

Two runs are the same job when their resolved configs agree on everything that
changes a result, on the same kind of device. Output paths are not in the config
(Hydra holds them), and the switches below change how a job runs, not what it
measures, so a resumed job keeps the identity of the attempt it continues.

The hash covers every key of the resolved config (flattened, each nested group named
by its class) whose value differs from the value committed for it in
``identity_defaults.json``, the schema's defaults as each key was added. So:

- a key added with a default keeps every existing id, once the snapshot records it
  (``python -m harness.job_identity`` adds the keys it lacks; a test fails until it is run);
- changing a key's default in the schema changes the id of every job that uses it,
  because the snapshot keeps the old default (entries are added, never rewritten), so a
  published folder measured at the old default is never taken for the new one;
- a job that names a GPU spec (``gpu=NAME``: the roofline prices its steps, or the shapes a
  profile lacks) also hashes ``ROOFLINE_VERSION`` (harness/serving/cost_model.py): a change of
  the formula, not only of a figure, gives its rows a new id, so resume never keeps rows the
  old formula priced. Jobs without a GPU spec keep their ids.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import typing
from pathlib import Path
from typing import Any

from kvbench.harness.config import Config
from kvbench.harness.scenarios import schemas
from kvbench.harness.serving.cost_model import ROOFLINE_VERSION

# Keys of the resolved config that leave the results unchanged. An engine's token_budget acts only through the
# max_num_batched_tokens it resolves to, which is hashed itself.
NOT_IDENTITY = ("resume", "progress", "gpu:GpuConfig.match", "engine:EngineConfig.token_budget")
SNAPSHOT = Path(__file__).with_name("identity_defaults.json")
# The host link's figures (conf/gpu/) price only the copies of a host tier or of swap: a job without
# either keeps the id it had before these figures existed.
HOST_LINK_KEYS = ("gpu:GpuConfig.host_link_gbps", "gpu:GpuConfig.host_link_latency_us")


def copies_to_host(cfg: Config) -> bool:
    return bool(cfg.device.host_kv_gb) or getattr(cfg, "preemption", "recompute") == "swap"


def _plain(value: Any) -> Any:
    """A JSON value, so a resolved value and the snapshot's compare alike (lists, tuples, enums)."""
    return json.loads(json.dumps(value, default=str))


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf of dataclass ``obj`` by path; a nested dataclass adds its class name as a leaf
    and to its fields' paths (``scenario`` = ``DecodeScenario``, ``scenario:DecodeScenario.warmup``)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value, path = getattr(obj, f.name), prefix + f.name
        if dataclasses.is_dataclass(value):
            out[path] = type(value).__name__
            out.update(flatten(value, f"{path}:{type(value).__name__}."))
        else:
            out[path] = _plain(value)
    return out


def _dataclass_types(tp: Any) -> list[type]:
    """The dataclasses a field may hold: its type (inside Optional/Union) and their subclasses."""
    found: list[type] = []
    todo = [a for a in typing.get_args(tp)] or [tp]
    while todo:
        t = todo.pop()
        if isinstance(t, type) and dataclasses.is_dataclass(t) and t not in found:
            found.append(t)
            todo.extend(t.__subclasses__())
    return found


def schema_defaults(cls: type = Config, prefix: str = "") -> dict[str, Any]:
    """Each key's default as the schema declares it now, by the paths ``flatten`` gives
    (a key with no default, such as a model's shape, is always part of the identity)."""
    out: dict[str, Any] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = prefix + f.name
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        if dataclasses.is_dataclass(default):
            out[path] = type(default).__name__
        elif default is not dataclasses.MISSING:
            out[path] = _plain(default)
        for t in _dataclass_types(hints[f.name]):
            out.update(schema_defaults(t, f"{path}:{t.__name__}."))
    return out


def load_snapshot() -> dict[str, Any]:
    return json.loads(SNAPSHOT.read_text())


def identity_fields(cfg: Config, device_slug: str, snapshot: dict[str, Any] | None = None) -> dict:
    recorded = load_snapshot() if snapshot is None else snapshot
    skip = NOT_IDENTITY if copies_to_host(cfg) else NOT_IDENTITY + HOST_LINK_KEYS
    fields = {path: value for path, value in flatten(cfg).items()
              if path not in skip and (path not in recorded or recorded[path] != value)}
    if cfg.gpu is not None:  # the roofline's formula prices the rows as much as its figures do
        fields["roofline_version"] = ROOFLINE_VERSION
    return {"config": fields, "device_slug": device_slug}


def job_id(cfg: Config, device_slug: str, snapshot: dict[str, Any] | None = None) -> str:
    """16 hex digits of the SHA-256 of the resolved config's keys that differ from the committed
    defaults (less NOT_IDENTITY) and the device slug."""
    text = json.dumps(identity_fields(cfg, device_slug, snapshot), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def missing_keys(snapshot: dict[str, Any] | None = None) -> dict[str, Any]:
    """Schema keys the snapshot lacks, with their current defaults."""
    recorded = load_snapshot() if snapshot is None else snapshot
    schemas()  # each scenario's dataclass is a subclass the walk must find: its module is imported
    return {k: v for k, v in schema_defaults().items() if k not in recorded}


def add_new_keys(path: Path = SNAPSHOT) -> dict[str, Any]:
    """Add the schema's keys that ``path`` lacks, with their defaults; existing entries stay as
    they are (rewriting one would give jobs at the old and the new default the same id)."""
    snapshot = json.loads(path.read_text()) if path.is_file() else {}
    new = missing_keys(snapshot)
    path.write_text(json.dumps({**snapshot, **new}, indent=1, sort_keys=True) + "\n")
    return new


def main() -> int:
    new = add_new_keys()
    print(f"{SNAPSHOT.name}: {len(new)} new key(s){': ' + ', '.join(sorted(new)) if new else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
