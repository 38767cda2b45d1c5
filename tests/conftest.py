"""Shared pytest set-up: hardware markers and the repository root."""

from __future__ import annotations

from pathlib import Path

import pytest

import kvbench.harness  # noqa: F401  (fixes MKL threading before torch loads)
import kvbench.kernels.triton_mode  # noqa: F401  (turns on the Triton interpreter on CPU before any kernel import)

REPO_ROOT = Path(__file__).resolve().parent.parent
# Tests by cost: `make test-fast` runs `-m "not slow"`, the unit tests of every room; `make test` runs all.
END_TO_END = ("tests/jobs/", "tests/bench/")  # whole commands, sweeps and benchmarks: slow by where they live
SLOW_LIST = REPO_ROOT / "tests" / "slow_tests.txt"  # unit tests measured over 1 s
FAST_LIMIT_S = 3.0  # a test that `-m "not slow"` ran for longer is named at the end, to be added to SLOW_LIST


def _slow_ids() -> set[str]:
    lines = SLOW_LIST.read_text().splitlines() if SLOW_LIST.is_file() else []
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; skipped without one")
    config.addinivalue_line("markers", "slow: takes more than a few seconds on CPU")
    config.addinivalue_line("markers", "nvcc: needs nvcc (no GPU); the GPU check runs them with the gpu tests")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    slow_ids, slow = _slow_ids(), pytest.mark.slow
    slow_files = tuple(i for i in slow_ids if "::" not in i)  # a file listed whole
    for item in items:
        if item.nodeid.startswith(END_TO_END + slow_files) or item.nodeid in slow_ids:
            item.add_marker(slow)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none found)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def compose():
    """Compose the Hydra config as the CLI would: ``compose(["+impl=paged_torch", "batch=4"])``."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from kvbench.harness.front.schemas import register_configs

    register_configs()

    def make(overrides: list[str]):
        with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base=None):
            # cpu_compile=false: the suite pays no inductor compile; tests/unit/harness/model/test_compiled.py checks it.
            return hydra_compose("config", overrides=["progress=false", "cpu_compile=false", *overrides])

    return make


_too_slow: list[tuple[str, float]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """In a run of the fast tests, note each one that took longer than ``FAST_LIMIT_S``."""
    if report.when == "call" and report.duration > FAST_LIMIT_S and "slow" not in report.keywords:
        _too_slow.append((report.nodeid, report.duration))


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if _too_slow and "not slow" in (config.getoption("markexpr") or ""):
        terminalreporter.write_line(f"fast tests over {FAST_LIMIT_S:g} s (add them to tests/slow_tests.txt):")
        for nodeid, seconds in sorted(_too_slow, key=lambda t: -t[1]):
            terminalreporter.write_line(f"  {seconds:5.1f} s  {nodeid}")
