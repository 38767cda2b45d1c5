"""The entry point: the completion line a shell sends is read with the aliases argv gets.

The console script and the shell completion themselves run in tests/jobs/test_console_script.py.
"""

from __future__ import annotations

import pytest

from kvbench.harness.__main__ import completion_line


@pytest.mark.parametrize("line, read", [
    # finished words: rewritten as argv is, so Hydra can compose them and offer the keys
    ("kvbench impl=paged impl.ke", "kvbench +impl=paged impl.ke"),
    ("kvbench max_num_seqs=4 workload.num", "kvbench batch=4 workload.num"),
    ("kvbench request_rate=5 arrival.r", "kvbench arrival=poisson arrival.rate=5 arrival.r"),
    ("kvbench -m impl=a,b batch=1,2 ", "kvbench -m +impl=a,b batch=1,2 "),
    ("python -m harness impl=paged mod", "python -m harness +impl=paged mod"),
    # the word being typed stays as typed (bash keeps the candidates that start with it)
    ("kvbench impl=pa", "kvbench impl=pa"),
    ("kvbench max_num", "kvbench max_num"),
    ("kvbench ", "kvbench "),
    ("kvbench", "kvbench"),
    ("", ""),
])
def test_the_completion_line_reads_aliases_as_argv_does(line, read):
    assert completion_line(line) == read



# ---- kvbench --version: kvbench's own, then what its rows depend on (Hydra's own flag printed "Hydra 1.3.8") ----

def test_version_names_kvbench_then_torch_triton_and_hydra():
    from importlib.metadata import version

    from kvbench.harness.__main__ import version_line

    line = version_line()
    assert line.startswith(f"kvbench {version('kvbench')} (torch {version('torch')}, triton ")
    assert line.endswith(f", hydra {version('hydra-core')})") and "\n" not in line


def test_version_without_the_installed_packages_reads_the_checkout(monkeypatch):
    """Run from a checkout that pip never installed: the version in pyproject.toml, and what is missing says so."""
    import tomllib

    import kvbench.harness.__main__ as entry
    from tests.conftest import REPO_ROOT

    monkeypatch.setattr(entry, "_installed", lambda *names: "9.9" if names == ("torch",) else None)
    ours = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert entry.version_line() == f"kvbench {ours} (torch 9.9, triton not installed, hydra not installed)"


@pytest.mark.parametrize("argv", [["--version"], ["batch=4", "--version"], ["-m", "--version"]])
def test_version_answers_before_hydra_and_the_preflight(argv, monkeypatch, capsys):
    import kvbench.harness.__main__ as entry
    import kvbench.harness.front.preflight as preflight

    monkeypatch.setattr(preflight, "check_command_line", lambda argv: pytest.fail("the preflight ran"))
    assert entry._run(argv) == 0
    assert capsys.readouterr().out == entry.version_line() + "\n"
