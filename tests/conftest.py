"""Shared pytest set-up: hardware markers and the repository root."""

from __future__ import annotations

from pathlib import Path

import pytest

import harness  # noqa: F401  (fixes MKL threading before torch loads)
import kernels  # noqa: F401  (turns on the Triton interpreter on CPU before any kernel import)

REPO_ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; skipped without one")
    config.addinivalue_line("markers", "slow: takes more than a few seconds on CPU")
    config.addinivalue_line("markers", "nvcc: needs nvcc (no GPU); the GPU check runs them with the gpu tests")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

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

    from harness.front.schemas import register_configs

    register_configs()

    def make(overrides: list[str]):
        with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base=None):
            # cpu_compile=false: the suite pays no inductor compile; tests/unit/harness/model/test_compiled.py checks it.
            return hydra_compose("config", overrides=["progress=false", "cpu_compile=false", *overrides])

    return make
