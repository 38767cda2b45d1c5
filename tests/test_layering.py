"""The layers run one way: conf -> harness -> impls -> kernels. Nothing lower imports anything higher."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

LAYERS = ["harness", "impls", "kernels"]  # each may import only itself and what follows it


def imported_packages(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("layer", LAYERS[1:])
def test_no_lower_layer_imports_a_higher_one(layer):
    higher = set(LAYERS[: LAYERS.index(layer)])
    offenders = {
        str(path.relative_to(REPO_ROOT)): sorted(imported_packages(path) & higher)
        for path in sorted((REPO_ROOT / layer).rglob("*.py"))
        if imported_packages(path) & higher
    }
    assert not offenders, f"{layer}/ imports a higher layer: {offenders}"


def test_the_cli_entry_point_does_not_load_torch():
    """`python -m harness --help` and `--cfg job` only read configs: torch (about 1-2 s) is not imported."""
    import subprocess
    import sys

    code = "import sys, harness.__main__; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT).returncode == 0
