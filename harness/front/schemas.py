"""The schema as Hydra reads it: the root dataclass and one ``scenario=NAME`` option per scenario module."""

from __future__ import annotations

from hydra.core.config_store import ConfigStore

from kvbench.harness.config import Config
from kvbench.harness.scenarios import schemas


def register_configs() -> None:
    # The other group files in conf/ are validated against the typed fields of ``Config``
    # when Hydra merges them; each scenario's dataclass is its group option itself.
    store = ConfigStore.instance()
    store.store(name="schema", node=Config)
    for name, schema in schemas().items():
        store.store(group="scenario", name=name, node=schema)
