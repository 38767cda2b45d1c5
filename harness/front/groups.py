"""The options of conf/'s groups read as dataclasses: one option of a group (``auto``'s choices), and
the impls on the config search path (every one of them when the job names none)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from kvbench.harness.config import Config, ImplConfig
from kvbench.harness.errors import ConfigError
from kvbench.harness.front.checks import choices
from kvbench.harness.paths import CONF_DIR


def load_group(group: str, name: str, schema: type):
    """One option of a config group, merged over its dataclass (used for ``auto``)."""
    path = CONF_DIR / group / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(f"{group}={name} is unknown; allowed: {', '.join(choices(group))}")
    return _load(path, schema)


def _load(path: Path, schema: type):
    """A config file merged over its dataclass (type-checked), as a dataclass instance."""
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.load(path)))


def impl_dirs() -> list[Path]:
    """conf/impl/, then the impl/ folder of every other config source on Hydra's search path
    (``hydra.searchpath=[file://DIR]``) when a Hydra app is running."""
    dirs = [CONF_DIR / "impl"]
    try:
        from hydra.core.hydra_config import HydraConfig

        sources = HydraConfig.get().runtime.config_sources
    except ValueError:  # not inside a Hydra app (a test calling run_job directly)
        sources = []
    for source in sources:
        if source.schema == "file" and (Path(source.path) / "impl").is_dir():
            dirs.append(Path(source.path) / "impl")
    return list(dict.fromkeys(d.resolve() for d in dirs))


def impl_names() -> list[str]:
    """Every impl on the search path, each once: an alias (conf/impl/paged.yaml, a file that
    composes another impl through its defaults list) has no ``name`` of its own and is skipped."""
    names = []
    for folder in impl_dirs():
        for path in sorted(folder.glob("*.yaml")):
            if OmegaConf.load(path).get("name") == path.stem and path.stem not in names:
                names.append(path.stem)
    return names


def load_impl(name: str) -> ImplConfig:
    """An impl's config by name; an alias (a defaults list naming its target) gives its target's."""
    for folder in impl_dirs():
        path = folder / f"{name}.yaml"
        if path.exists():
            raw = OmegaConf.load(path)
            if "name" not in raw and raw.get("defaults"):
                return load_impl(str(raw.defaults[0]))
            return _load(path, ImplConfig)
    raise ConfigError(f"impl={name} is unknown; allowed: {', '.join(impl_names())}")


def impls_to_run(cfg: Config) -> list[ImplConfig]:
    """The chosen impl, or every impl on the search path (one row each)."""
    if cfg.impl is not None:
        return [cfg.impl]
    return [load_impl(name) for name in impl_names()]
