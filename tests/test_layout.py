"""The tests mirror the source: a module's unit tests are found from its path.

``tests/unit/<dir>/test_<name>[_<aspect>].py`` tests ``<dir>/<name>.py`` (or the package
``<dir>/<name>/``); whole jobs and commands are under ``tests/jobs/``, shared test code
under ``tests/helpers/``, benchmarks under ``tests/bench/``.
"""

from __future__ import annotations

from pathlib import Path

from tests.conftest import REPO_ROOT

TESTS = REPO_ROOT / "tests"


def source_under_test(test_file: Path) -> Path | None:
    """The module or package a unit test file names: the longest ``<name>`` of ``test_<name>_...`` that exists."""
    folder = REPO_ROOT / test_file.parent.relative_to(TESTS / "unit")
    words = test_file.stem.removeprefix("test_").split("_")
    for k in range(len(words), 0, -1):
        name = "_".join(words[:k])
        for candidate in (folder / f"{name}.py", folder / name / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def test_every_unit_test_file_names_the_module_it_tests():
    orphans = [str(f.relative_to(REPO_ROOT)) for f in sorted((TESTS / "unit").rglob("test_*.py"))
               if source_under_test(f) is None]
    assert not orphans, f"unit test files whose path names no module: {orphans}"


def test_the_mirror_can_fail(tmp_path):
    assert source_under_test(TESTS / "unit" / "harness" / "serving" / "test_scheduler.py").name == "scheduler.py"
    assert source_under_test(TESTS / "unit" / "harness" / "serving" / "test_engine_batched_prefill.py").name == "engine.py"
    assert source_under_test(TESTS / "unit" / "harness" / "test_report_robust.py").parent.name == "report"
    assert source_under_test(TESTS / "unit" / "harness" / "serving" / "test_nothing_here.py") is None


def test_helpers_sit_apart_from_tests():
    """Only test files (and package markers) among the tests; shared code is in tests/helpers/."""
    strays = [str(f.relative_to(REPO_ROOT)) for room in ("unit", "jobs") for f in sorted((TESTS / room).rglob("*.py"))
              if not f.name.startswith("test_") and f.name != "__init__.py"]
    assert not strays, f"helper modules among the tests (move them to tests/helpers/): {strays}"


def test_pyproject_maps_every_package_folder_under_the_kvbench_name():
    """pyproject.toml lists kvbench's packages by hand (a folder is mapped, not found): every folder with an
    __init__.py under harness/ and impls/, and kernels/, is there, and nothing else of kvbench's."""
    import tomllib

    setup = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    want = {"kvbench." + ".".join(init.parent.relative_to(REPO_ROOT).parts)
            for top in ("harness", "impls") for init in (REPO_ROOT / top).rglob("__init__.py")}
    listed = {p for p in setup["packages"] if p.startswith("kvbench.")}
    assert listed == want | {"kvbench.kernels"}
    assert setup["package-dir"] == {f"kvbench.{top}": top for top in ("harness", "impls", "kernels")}
