"""The layers run one way: conf -> harness -> impls -> kernels, and inside harness/ its rooms run one way too.

Nothing lower imports anything higher. Every import counts, the ones inside functions too
(a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

LAYERS = ["harness", "impls", "kernels"]  # each may import only itself and what follows it

# harness/'s rooms and what each may import besides itself (and impls/, kernels/): lowest first.
FOUNDATION = {"harness.errors", "harness.paths", "harness.results", "harness.untrusted"}
ROOMS: dict[str, set[str]] = {
    "harness.errors": set(),
    "harness.paths": set(),
    "harness.results": set(),  # the tidy row schema and how tables are written
    # SECURITY.md's rules: how a folder kvbench did not make is read and written (its CSVs as results writes
    # them), and how git is asked about the checkout (read-only, from the checkout's root)
    "harness.untrusted": {"harness.results", "harness.paths"},
    "harness.model": FOUNDATION,
    "harness.config": FOUNDATION | {"harness.model"},  # the schema's model group is the model's own config
    "harness.measure": FOUNDATION,
    "harness.kv": FOUNDATION | {"harness.config", "harness.model", "harness.measure"},
    "harness.serving": FOUNDATION | {"harness.config", "harness.model", "harness.measure", "harness.kv"},
    "harness.scenarios": FOUNDATION | {"harness.config", "harness.model", "harness.measure", "harness.kv",
                                       "harness.serving"},
    "harness.job": FOUNDATION | {"harness.config", "harness.model", "harness.measure", "harness.kv",
                                 "harness.serving", "harness.scenarios"},
    "harness.front": FOUNDATION | {"harness.config", "harness.model", "harness.measure", "harness.kv",
                                   "harness.serving", "harness.scenarios", "harness.job"},
    # The report reads finished tables: the row schema, and the GPU specs in conf/gpu/.
    "harness.report": FOUNDATION | {"harness.measure"},  # measure: the definitions of figures it recomputes
    # The entry points: ``python -m harness``, and the old module paths kept for the commands users type.
    "harness.__main__": {"harness.front"},
    "harness.replay": {"harness.front"},
    "harness.job_identity": {"harness.job"},
    "harness": set(),  # harness/__init__.py
}


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            if node.module == "harness":  # ``from harness import scenarios``
                names |= {f"harness.{alias.name}" for alias in node.names}
    return names


def imported_packages(path: Path) -> set[str]:
    return {name.split(".")[0] for name in imported_modules(path)}


def room_of(module: str) -> str | None:
    """The longest room name that ``module`` is, or is inside of."""
    parts = module.split(".")
    for k in range(len(parts), 0, -1):
        if ".".join(parts[:k]) in ROOMS:
            return ".".join(parts[:k])
    return None


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts).removesuffix(".__init__")


HARNESS_FILES = sorted((REPO_ROOT / "harness").rglob("*.py"))


@pytest.mark.parametrize("layer", LAYERS[1:])
def test_no_lower_layer_imports_a_higher_one(layer):
    higher = set(LAYERS[: LAYERS.index(layer)])
    offenders = {
        str(path.relative_to(REPO_ROOT)): sorted(imported_packages(path) & higher)
        for path in sorted((REPO_ROOT / layer).rglob("*.py"))
        if imported_packages(path) & higher
    }
    assert not offenders, f"{layer}/ imports a higher layer: {offenders}"


def test_every_harness_module_is_in_a_room():
    homeless = [module_name(p) for p in HARNESS_FILES if room_of(module_name(p)) is None]
    assert not homeless, f"modules in no room of ROOMS: {homeless}"


def climbs(path: Path, module: str) -> list[str]:
    """The modules ``path`` (the module ``module``) imports from rooms its own room may not import."""
    own = room_of(module)
    return sorted(m for m in imported_modules(path) if m.startswith("harness")
                  and (r := room_of(m)) is not None and r != own and r not in ROOMS[own])


def test_each_room_imports_only_what_lies_below_it():
    offenders = {str(p.relative_to(REPO_ROOT)): bad for p in HARNESS_FILES if (bad := climbs(p, module_name(p)))}
    assert not offenders, f"imports a room its own may not (tests/test_layering.py ROOMS): {offenders}"


def test_the_room_rules_can_fail(tmp_path):
    """The check sees a climb, a lazy one included: serving/ importing front/ inside a function."""
    module = tmp_path / "climb.py"
    module.write_text("def f():\n    from harness.front.resolve import resolve\n")
    assert climbs(module, "harness.serving.climb") == ["harness.front.resolve"]
    assert climbs(module, "harness.front.climb") == []


def test_few_modules_sit_at_the_top_of_harness():
    top = sorted(p.name for p in (REPO_ROOT / "harness").glob("*.py"))
    assert len(top) <= 8, top


def test_the_cli_entry_point_does_not_load_torch():
    """`python -m harness --help` and `--cfg job` only read configs: torch (about 1-2 s) is not imported."""
    import subprocess
    import sys

    code = "import sys, harness.__main__; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT).returncode == 0
