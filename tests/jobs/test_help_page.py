"""``kvbench --help`` answers without Hydra composing the config (harness/front/help_page.py), and says
exactly what Hydra's own help says: the fast path cannot drift from the page it stands in for."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

# Hydra's whole help path: the app itself (harness/front/app.py) handed --help, composing the config
HYDRAS_OWN = "import sys; from kvbench.harness.front.app import main; sys.argv[1:] = [sys.argv[1]]; main()"


def python(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_the_fast_page_is_hydras_page_byte_for_byte(flag):
    hydras = python("-c", HYDRAS_OWN, flag)
    fast = python("-m", "harness", flag)
    assert hydras.returncode == 0 and fast.returncode == 0, hydras.stderr + fast.stderr
    assert hydras.stdout.startswith("kvbench: ") and "scenario: " in hydras.stdout  # kvbench's page, groups listed
    assert fast.stdout == hydras.stdout and fast.stderr == ""


def test_help_imports_neither_the_app_nor_pandas():
    """What made --help take two seconds: the app's imports (pandas, the scenario schemas) and Hydra's
    composition (the preflight check's, then the app's) and its listing."""
    p = python("-X", "importtime", "-m", "harness", "--help")
    assert p.returncode == 0 and p.stdout.startswith("kvbench: "), p.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in p.stderr.splitlines() if line.startswith("import time:")}
    assert "kvbench.harness.front.help_page" in imported  # the check can fail: the fast path's own module is there
    assert not imported & {"pandas", "kvbench.harness.front.app", "kvbench.harness.front.preflight",
                           "kvbench.harness.front.schemas"}, sorted(imported)


def test_help_with_an_override_is_still_composed_by_hydra():
    """Only the bare flag takes the fast path: with an override Hydra composes it, as before (a bad one fails)."""
    p = python("-m", "harness", "--help", "model=nope")
    assert p.returncode != 0 and "nope" in p.stderr and p.stdout == "", p.stderr
