"""``kvbench --help`` without composing the config: the same page as Hydra's, in a fraction of the time.

Hydra answers ``--help`` by composing the whole config and then listing each config group's options,
where every listing deep-copies its config repository (the scenario schemas with it): about a
second, and importing the app (pandas, through the scenario modules) another. The page itself
(conf/hydra/help/kvbench.yaml) uses only ``$APP_CONFIG_GROUPS``: one line per group that is not
Hydra's own, its options sorted. That list comes from two sources, read here as Hydra reads them:
the groups and yaml files under conf/ (Hydra's own file source lists them) and the ``scenario=``
options that harness/front/schemas.py registers, one per scenario module. kvbench installs no
SearchPathPlugin, so no other source adds a group.

A page this cannot render exactly as Hydra would (another help option chosen, a template naming
``$CONFIG`` or ``$FLAGS_HELP``, an interpolation) gets ``None``, and the command goes to Hydra.
tests/jobs/test_help_page.py compares this page with Hydra's own, byte for byte.
"""

from __future__ import annotations

import pkgutil
import string
from pathlib import Path

from kvbench.harness.paths import CONF_DIR

HELP_FLAGS = (["--help"], ["-h"])  # Hydra's flags for the app's help, given alone (no override to compose)


def _is_hydra_group(group: str) -> bool:
    return group == "hydra" or group.startswith("hydra/")  # Hydra's own get_help predicate


def _raw_yaml(path: Path) -> dict:
    """A yaml file's content as written: an interpolation stays text, nothing is resolved."""
    from omegaconf import OmegaConf

    content = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    return content if isinstance(content, dict) else {}


def help_option(conf_dir: Path) -> str | None:
    """The ``hydra/help`` option config.yaml's defaults list chooses, or None when it chooses none or
    config.yaml sets ``hydra.help`` keys itself (merged over the option: only Hydra composes that)."""
    root = _raw_yaml(conf_dir / "config.yaml")
    if "help" in (root.get("hydra") or {}):
        return None
    for entry in root.get("defaults") or []:
        if isinstance(entry, dict):
            for key, value in entry.items():
                if str(key).split()[-1] == "hydra/help":  # ``override hydra/help: kvbench``
                    return str(value)
    return None


def _file_groups(conf_dir: Path) -> dict[str, set[str]]:
    """``{group: options}`` for every group under ``conf_dir`` holding yaml files, nested ones as ``a/b``."""
    from hydra._internal.core_plugins.file_config_source import FileConfigSource
    from hydra.core.object_type import ObjectType

    source = FileConfigSource(provider="main", path=str(conf_dir))
    found: dict[str, set[str]] = {}
    parents = [""]
    while parents:
        parent = parents.pop()
        for child in source.list(parent, ObjectType.GROUP):
            group = f"{parent}/{child}" if parent else child
            if options := source.list(group, ObjectType.CONFIG):
                found[group] = set(options)
            parents.append(group)
    return found


def scenario_names() -> set[str]:
    """The ``scenario=`` options: the scenario modules' names, as ``harness.scenarios.schemas`` finds them,
    without importing the modules (their schemas are what pulls pandas in)."""
    import kvbench.harness.scenarios as scenarios

    return {m.name for m in pkgutil.iter_modules(scenarios.__path__) if m.name not in scenarios.NOT_SCENARIOS}


def app_config_groups(conf_dir: Path = CONF_DIR) -> str:
    """Hydra's ``$APP_CONFIG_GROUPS``: ``group: a, b, c`` per line, groups and options sorted."""
    groups = {g: options for g, options in _file_groups(conf_dir).items() if not _is_hydra_group(g)}
    groups.setdefault("scenario", set()).update(scenario_names())
    return "".join(f"{group}: {', '.join(sorted(options))}\n" for group, options in sorted(groups.items()))


def help_page(conf_dir: Path = CONF_DIR) -> str | None:
    """The text Hydra's ``--help`` prints (less print's newline), or None when only Hydra can render it."""
    option = help_option(conf_dir)
    page = conf_dir / "hydra" / "help" / f"{option}.yaml"
    if option is None or not page.is_file():
        return None  # Hydra's default page (it names Hydra's flags and the whole config), or a packaged one
    template = _raw_yaml(page).get("template")
    if not isinstance(template, str) or "${" in template:
        return None  # an interpolation resolves against the composed config
    try:  # a variable other than $APP_CONFIG_GROUPS (KeyError) or a stray $ (ValueError): Hydra's to render
        return string.Template(template).substitute(APP_CONFIG_GROUPS=app_config_groups(conf_dir))
    except (KeyError, ValueError):
        return None
