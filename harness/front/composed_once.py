"""The config loader of a sweep, composing each job once (harness/front/sweeper.py uses it)."""

from __future__ import annotations

from typing import Any, Sequence

from omegaconf import DictConfig


class ComposedOnce:
    """The config loader, keeping the config the sweeper's check composed for each job until the
    launcher asks for that job's: Hydra's launcher composes every job itself, so each job was composed
    twice (about 0.35 s each on these machines, half a minute over a sweep of ~80 jobs). Anything
    else goes to the loader."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader
        self._kept: dict[tuple[str, ...], DictConfig] = {}

    def compose(self, master_config: DictConfig, overrides: Sequence[str]) -> None:
        """Compose the job (raising what composing it raises) and keep its config for the launcher."""
        self._kept[tuple(overrides)] = self._loader.load_sweep_config(master_config, list(overrides))

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        kept = self._kept.pop(tuple(sweep_overrides), None)  # handed out once: the launcher edits it
        return kept if kept is not None else self._loader.load_sweep_config(master_config, sweep_overrides)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # not set yet (unpickling in a launcher's worker): never the loader's
            raise AttributeError(name)
        return getattr(self._loader, name)

    def __getstate__(self) -> dict:
        return {"_loader": self._loader, "_kept": {}}  # a worker process composes for itself
