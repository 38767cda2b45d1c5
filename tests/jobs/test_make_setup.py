"""``make setup`` says what it installs, one line per step, and installs from the wheels folder when it has wheels.

Read from ``make -n`` (the commands it would run, without running them): the set-up itself is
what every other test already runs under.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def setup_recipe(*args: str) -> str:
    p = subprocess.run(["make", "-n", "-B", "setup", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_each_install_step_says_what_it_installs():
    recipe = setup_recipe()
    assert 'echo "setup: torch: the CPU build (torch==' in recipe
    assert 'echo "setup: kvbench (editable, with the kvbench command) and its test extras' in recipe
    assert recipe.index("setup: torch") < recipe.index("setup: kvbench")  # torch first: the CPU wheel, not CUDA's
    assert "--find-links" not in recipe  # no wheels folder here: the package index


def test_a_wheels_folder_is_used_for_every_install_and_said(tmp_path):
    (tmp_path / "torch-2.13.0+cpu-cp311-none-any.whl").touch()
    recipe = setup_recipe(f"WHEELS={tmp_path}")
    installs = [line for line in recipe.splitlines() if "pip install" in line]
    assert len(installs) == 2 and all(f"--find-links {tmp_path}" in line for line in installs), installs
    assert recipe.count(f"(with the wheels in {tmp_path}/)") == 2
