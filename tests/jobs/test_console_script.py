"""The ``kvbench`` console script as users run it: the same door as ``python -m harness``, bash
completion through Hydra (``eval "$(kvbench -sc install=bash)"``), and its own ``--help`` page.

Every command runs the installed script (pyproject.toml [project.scripts]) in a subprocess,
from a folder outside the checkout.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from kvbench.harness.scenarios import schemas
from tests.conftest import REPO_ROOT

KVBENCH = Path(sys.executable).with_name("kvbench")
CONF = REPO_ROOT / "conf"


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PATH": os.pathsep.join([str(KVBENCH.parent), os.environ.get("PATH", "")]), **extra}


def kvbench(*args: str, cwd: Path, **extra_env: str) -> subprocess.CompletedProcess:
    assert KVBENCH.is_file(), f"{KVBENCH} is missing: run make setup (pip install -e .) to install the console script"
    return subprocess.run([str(KVBENCH), *args], cwd=cwd, env=env(**extra_env), capture_output=True, text=True,
                          timeout=300)


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def query(line: str, cwd: Path) -> list[str]:
    """The candidates Hydra's bash completion gives for ``line`` (what the installed bash function asks for)."""
    p = kvbench("-sc", "query=bash", cwd=cwd, COMP_LINE=line, COMP_POINT=str(len(line)))
    assert p.returncode == 0, p.stderr
    return p.stdout.split()


@pytest.mark.parametrize("line, expected", [
    ("kvbench imp", ["impl="]),
    ("kvbench +imp", ["+impl="]),
    ("kvbench +impl=", [f"+impl={name}" for name in options("impl")]),
    ("kvbench impl=paged_", ["impl=paged_cuda", "impl=paged_flex", "impl=paged_torch", "impl=paged_triton"]),
    ("kvbench model=tiny", ["model=tiny-llama", "model=tiny-mistral", "model=tiny-qwen2"]),
    ("kvbench scenario=", [f"scenario={name}" for name in sorted(schemas())]),  # the scenario registry
    ("kvbench scenario=kernel scenario.con", ["scenario.context_len="]),
    ("kvbench +impl=paged ba", ["batch="]),
    # an alias among the finished words is read as kvbench reads it (harness/__main__.py completion_line)
    ("kvbench impl=paged impl.ke", ["impl.kernel="]),
    ("kvbench max_num_seqs=4 workload.num", ["workload.num_requests="]),
])
def test_completion_offers_groups_options_and_keys(tmp_path, line, expected):
    got = query(line, tmp_path)
    assert set(expected) <= set(got), got


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_installed_bash_completion_completes_on_tab(tmp_path):
    """The script ``-sc install=bash`` prints, evaluated in bash, and its function called as bash calls it on TAB."""
    script = r'''
eval "$(kvbench -sc install=bash)"
complete -p kvbench
for line in "kvbench imp" "kvbench +impl=paged model=tiny-l" "kvbench impl=paged impl.ke"; do
  COMP_LINE="$line"; COMP_POINT=${#line}; read -ra COMP_WORDS <<< "$line"; COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
  COMPREPLY=(); hydra_bash_completion
  echo "$line -> ${COMPREPLY[*]}"
done
'''
    p = subprocess.run(["bash", "--norc", "--noprofile", "-c", script], cwd=tmp_path, env=env(), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert "hydra_bash_completion kvbench" in lines[0], lines  # the rule bash will use for kvbench
    assert lines[1:] == ["kvbench imp -> impl. impl=",
                         "kvbench +impl=paged model=tiny-l -> model=tiny-llama",
                         "kvbench impl=paged impl.ke -> impl.kernel="], lines


@pytest.fixture(scope="module")
def help_page(tmp_path_factory) -> str:
    p = kvbench("--help", cwd=tmp_path_factory.mktemp("help"))
    assert p.returncode == 0, p.stderr
    return p.stdout


def group_line(page: str, group: str) -> list[str]:
    (line,) = [ln for ln in page.splitlines() if ln.startswith(f"{group}: ")]
    return line.removeprefix(f"{group}: ").split(", ")


# (the gpu group's id is not "gpu": tests/conftest.py skips a test with that keyword on a machine without one)
@pytest.mark.parametrize("group", ["impl", "model", "workload", "arrival", "slo", pytest.param("gpu", id="gpu-specs"),
                                   "device"])
def test_help_lists_each_groups_options_in_one_line_as_conf_holds_them(help_page, group):
    assert group_line(help_page, group) == options(group)


def test_help_lists_the_scenarios_of_the_registry(help_page):
    assert group_line(help_page, "scenario") == sorted(schemas())


def examples(page: str) -> list[str]:
    """The example command lines of the help page, without their comments."""
    block = page.split("== Examples ==\n", 1)[1].split("\n\n", 1)[0]
    return [ln.split("#", 1)[0].strip() for ln in block.splitlines() if ln.strip().startswith("kvbench ")]


def test_help_is_kvbenchs_page_with_five_examples_and_the_readme(help_page, tmp_path):
    assert help_page.startswith("kvbench: ") and "powered by Hydra" not in help_page
    assert len(examples(help_page)) == 5
    assert "README.md" in help_page and 'eval "$(kvbench -sc install=bash)"' in help_page
    same = subprocess.run([sys.executable, "-m", "kvbench.harness", "--help"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env=env())
    assert same.stdout == help_page  # the same door


@pytest.mark.slow
def test_every_example_of_the_help_page_runs(help_page, tmp_path):
    """Each example as printed, with only its folder chosen: exit 0, and every row ok (about 20 s on 2 cores)."""
    for i, command in enumerate(examples(help_page)):
        args = shlex.split(command)[1:]
        folder = tmp_path / str(i)
        where = "hydra.sweep.dir" if "-m" in args else "hydra.run.dir"
        p = kvbench(*args, f"{where}={folder}", cwd=tmp_path)
        assert p.returncode == 0, f"{command}: {p.stderr[-2000:]}"
        rows = pd.concat(pd.read_csv(f) for f in folder.rglob("rows.csv"))
        assert len(rows) and (rows.status == "ok").all(), f"{command}: {rows[['impl', 'status', 'error']]}"


@pytest.mark.parametrize("args, expected", [
    (["--hydra-help"], "== Flags =="),
    (["--cfg", "job", "impl=paged", "max_num_seqs=3"], "batch: 3"),  # aliases apply; no run, no folder
    (["--info", "defaults"], "hydra/help/kvbench"),
    (["-sc", "install=bash"], "complete -o nospace -o default -F hydra_bash_completion kvbench"),
])
def test_hydras_own_flags_pass_the_preflight(tmp_path, args, expected):
    p = kvbench(*args, cwd=tmp_path)
    assert p.returncode == 0 and expected in p.stdout, p.stderr
    assert not any(tmp_path.iterdir())  # nothing ran: no run folder


def test_a_run_through_the_script_is_a_run(tmp_path):
    """The same alias notes and preflight as python -m harness: a bad value is one line, exit 2, and its row."""
    p = kvbench("impl=paged_torch", "batch=0", f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path)
    assert p.returncode == 2
    note, error = p.stderr.splitlines()
    assert note == ("kvbench: note: impl=paged_torch taken as +impl=paged_torch "
                    "(impl is in no defaults list, so it is added with +)")
    assert error.startswith("kvbench: ") and error.endswith("ConfigError: batch=0 must be >= 1"), p.stderr
    assert pd.read_csv(tmp_path / "r" / "rows.csv").status[0] == "error"


# ---- a well-made Unix tool: its own --version, quiet when its reader has gone (issue 41, "Command line") ----

def test_version_is_kvbenchs_own_then_what_it_runs_on(tmp_path):
    """``kvbench --version`` printed Hydra's ("Hydra 1.3.8"); python -m harness --version is the same door."""
    from importlib.metadata import version

    for argv in ([str(KVBENCH), "--version"], [sys.executable, "-m", "kvbench.harness", "--version"]):
        p = subprocess.run(argv, cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=120)
        assert p.returncode == 0 and p.stderr == "", p.stderr
        assert p.stdout.startswith(f"kvbench {version('kvbench')} (torch {version('torch')}, triton ")
        assert p.stdout.endswith(f", hydra {version('hydra-core')})\n") and not any(tmp_path.iterdir())


def with_closed_stdout(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``argv`` writing into a pipe whose reader has already gone (``| head -3`` once head has its lines):
    every write to stdout fails with EPIPE, whatever the timing."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(argv, cwd=cwd, env=env(), stdout=write, stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write)


@pytest.mark.parametrize("args", [
    ["--help"],  # Hydra's help: a BrokenPipeError traceback, exit 1
    ["-sc", "install=bash"],  # inside Hydra's own error handler, which printed the traceback itself
    ["--cfg", "job"],
    ["--version"],
])
def test_a_closed_pipe_ends_quietly_with_141(tmp_path, args):
    p = with_closed_stdout([str(KVBENCH), *args], tmp_path)
    assert (p.returncode, p.stderr) == (141, ""), p.stderr


def test_a_run_whose_reader_has_gone_writes_its_rows_and_ends_quietly(tmp_path):
    """The run's summary is what fails to reach the reader: the rows are written all the same."""
    p = with_closed_stdout([str(KVBENCH), "+impl=paged_torch", "scenario=capacity", "model=tiny-llama",
                            f"hydra.run.dir={tmp_path / 'r'}"], tmp_path)
    assert p.returncode == 141 and "Traceback" not in p.stderr and "Error" not in p.stderr, p.stderr
    assert pd.read_csv(tmp_path / "r" / "rows.csv").status.tolist() == ["ok"]
