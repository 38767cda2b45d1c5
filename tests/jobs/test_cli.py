"""The CLI as users run it: `python -m harness ...` in a subprocess, its folder and its errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from kvbench.harness.results import COLUMNS
from tests.conftest import REPO_ROOT

FAST = ["model=tiny-llama", "max_seq_len=64", "workload.num_requests=3", "workload.prompt_len=12",
        "workload.output_len=5", "scenario.warmup=0"]


def harness(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=300, env={**__import__("os").environ})


def test_one_run_writes_a_complete_run_folder(tmp_path):
    out = tmp_path / "r1"
    p = harness("+impl=contiguous", "batch=2", "workload=uniform", "seed=3", *FAST, f"hydra.run.dir={out}")
    assert p.returncode == 0, p.stderr
    for name in ("config.yaml", "env.json", "rows.csv", "rows.parquet", "tokens.jsonl"):
        assert (out / name).exists(), name
    df = pd.read_parquet(out / "rows.parquet")
    assert list(df.columns[: len(COLUMNS)]) == COLUMNS
    row = df.iloc[0]
    assert row.status == "ok" and row.impl == "contiguous" and row.seed == 3 and row.batch == 2
    assert row.output_tokens > 0 and row.tokens_per_s > 0 and row.step_ms_p50 > 0
    assert 0 < row.host_ms_p50 <= row.step_ms_p50 and row.host_ms_p50 <= row.host_ms_p90  # enqueue time is part of the step
    assert pd.isna(row.nvml_used_bytes) and "NVML" in row.notes  # no driver here: empty, with the reason
    env = json.loads((out / "env.json").read_text())
    assert env["torch_version"] and env["device"] == "cpu"
    tokens = [json.loads(line) for line in (out / "tokens.jsonl").read_text().splitlines()]
    assert [t["request_id"] for t in tokens] == [0, 1, 2]
    assert all(len(t["output_ids"]) >= 1 and t["prompt_ids"] for t in tokens)


@pytest.mark.parametrize(
    "override, expected",
    [
        ("batch=0", "batch=0 must be >= 1"),
        ("max_num_batched_tokens=0", "max_num_batched_tokens=0 must be >= 1"),
        ("dtype=float8", "allowed: float32, float16, bfloat16"),
        ("block_size=12", "block_size=12 must be a power of two"),
        ("model.path=/nonexistent/model", "model.path"),
        ("workload.distribution=gauss", "workload.distribution='gauss' is not allowed"),
        ("seed=-1", "seed=-1 must be >= 0"),  # numpy's generator refused it with a traceback, and no row
        ("workload.sigma=-1", "workload.sigma=-1.0 must be > 0"),
        ("workload.spread=1.5", "workload.spread=1.5 must be in [0, 1)"),
    ],
)
def test_bad_input_is_one_line_naming_the_key(tmp_path, override, expected):
    p = harness("+impl=contiguous", override, *FAST, f"hydra.run.dir={tmp_path}")
    assert p.returncode == 2
    assert expected in p.stderr and "Traceback" not in p.stderr
    row = pd.read_csv(tmp_path / "rows.csv").iloc[0]  # the failure is recorded, not lost
    assert row.status == "error" and expected in row.error


def test_unknown_impl_lists_the_valid_ones(tmp_path):
    p = harness("+impl=nope", f"hydra.run.dir={tmp_path}")
    assert p.returncode != 0
    assert "impl/nope" in p.stderr and "paged_triton" in p.stderr and "contiguous" in p.stderr


def test_a_failing_job_does_not_stop_the_sweep(tmp_path):
    p = harness("-m", "+impl=paged_torch", "batch=0,2", *FAST, f"hydra.sweep.dir={tmp_path}")
    assert p.returncode == 2, p.stderr  # the sweep says that a job failed
    rows = pd.concat(pd.read_csv(tmp_path / str(i) / "rows.csv") for i in (0, 1))
    assert sorted(rows.status) == ["error", "ok"]
    assert f"2 jobs: 1 error, 1 ok: {tmp_path / '0'}" in p.stderr


@pytest.mark.parametrize(
    "override, expected",
    [
        ("batch=abc", "batch=abc: Value 'abc' of type 'str' could not be converted to Integer"),
        ("model=nope", "model=nope is unknown"),
        ("workload.promptlen=5", "workload.promptlen is not a config key; did you mean workload.prompt_len?"),
        ("+workload.promptlen=5", "workload.promptlen is not a config key; did you mean workload.prompt_len?"),
        ("model.name=llama-2-7b", "choose it with model=llama-2-7b"),
        # a key of a group that has no option chosen (gpu is null by default): Hydra's bare AssertionError before
        ("gpu.count=2", "gpu.count=2 sets a key of gpu, but no gpu is chosen; choose one with gpu=NAME "
                        "(allowed: a100-40gb, a100-80gb, a100-80gb-pcie, h100-nvl, h100-pcie, h100-sxm, h200, l4, l40s, rtx-4090)"),
        # a key of another scenario (each scenario has its own dataclass)
        ("scenario.warmup=0", "scenario.warmup belongs to scenario=decode, kernel, max_rate, profile, not scenario=capacity "
                              "(scenario=capacity keys: name, concurrency_points)"),
    ],
)
def test_hydra_level_errors_are_one_line_with_a_row(tmp_path, override, expected):
    """Type errors, unknown keys (with or without +) and options, a relabelled model."""
    p = harness("+impl=paged_torch", "scenario=capacity", override, f"hydra.run.dir={tmp_path}")
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().count("\n") == 0 and expected in p.stderr, p.stderr  # one line
    row = pd.read_csv(tmp_path / "rows.csv").iloc[0]
    assert row.status == "error" and expected in row.error


def test_a_key_of_an_unchosen_impl_names_the_plus_override(tmp_path):
    """impl is in no defaults list, so its keys need +impl=NAME first; each job of a sweep says so too."""
    p = harness("-m", "scenario=capacity", "impl.kernel=sdpa,torch", f"hydra.sweep.dir={tmp_path}")
    assert p.returncode == 2
    for num, kernel in enumerate(("sdpa", "torch")):  # the sweeper's check of each job (harness/front/sweeper.py)
        expected = f"impl.kernel={kernel} sets a key of impl, but no impl is chosen; choose one with +impl=NAME"
        assert pd.read_csv(tmp_path / str(num) / "rows.csv").error[0].startswith(f"ConfigError: {expected}")
        assert expected in p.stderr, p.stderr


def test_a_key_of_a_defaulted_group_is_not_taken_for_the_unchosen_one(tmp_path):
    """workload has a default option, so workload.sigma is fine: the message names gpu, which has none."""
    p = harness("scenario=capacity", "workload.sigma=0.5", "gpu.count=2", f"hydra.run.dir={tmp_path}")
    assert p.returncode == 2
    assert "gpu.count=2 sets a key of gpu, but no gpu is chosen" in p.stderr and "workload" not in p.stderr, p.stderr


def test_a_sweep_with_one_bad_value_runs_the_others(tmp_path):
    p = harness("-m", "+impl=paged_torch", "scenario=capacity", "model=tiny-llama", "batch=1,abc,2",
                f"hydra.sweep.dir={tmp_path}")
    assert p.returncode == 2
    rows = {i: pd.read_csv(tmp_path / str(i) / "rows.csv") for i in (0, 1, 2)}
    assert [len(r) for r in rows.values()] == [1, 1, 1]  # every job has its row, once
    assert [rows[i].status[0] for i in (0, 1, 2)] == ["ok", "error", "ok"]
    assert [str(rows[i].batch[0]) for i in (0, 1, 2)] == ["1", "abc", "2"]
    assert "batch=abc" in rows[1].error[0]
    assert p.stderr.strip().splitlines()[-1] == f"kvbench: 3 jobs: 2 ok, 1 error: {tmp_path / '1'}"


@pytest.mark.parametrize("override, key", [
    ("seed=99999999999999999999999", "seed"),
    ("batch=36893488147419103232", "batch"),
    ("max_num_batched_tokens=-99999999999999999999", "max_num_batched_tokens"),
    ("workload.num_requests=18446744073709551616", "workload.num_requests"),
    ("scenario.concurrency_points=[1,99999999999999999999]", "scenario.concurrency_points"),
])
def test_an_integer_key_beyond_int64_is_one_line_with_a_row_both_tables_hold(tmp_path, override, key):
    """Refused before any value is used; the error row is written whole (Parquet holds the value as text)."""
    p = harness("+impl=paged_torch", "scenario=capacity", override, f"hydra.run.dir={tmp_path}")
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().count("\n") == 0 and f"{key}=" in p.stderr and "out of range" in p.stderr, p.stderr
    for row in (pd.read_csv(tmp_path / "rows.csv").iloc[0], pd.read_parquet(tmp_path / "rows.parquet").iloc[0]):
        assert row.status == "error" and "out of range" in row.error


def test_a_run_whose_host_memory_cannot_fit_is_refused_before_anything_is_built(tmp_path):
    """capacity with batch=1e9 would draw a billion requests (num_requests defaults to batch): one line, a row."""
    p = harness("+impl=paged_torch", "scenario=capacity", "batch=1000000000", f"hydra.run.dir={tmp_path}")
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0 and "the workload needs about" in p.stderr, p.stderr
    row = pd.read_csv(tmp_path / "rows.csv").iloc[0]
    assert row.status == "error" and "of the free RAM" in row.error and "workload.num_requests" in row.error


def test_a_memory_error_anywhere_in_a_job_is_an_oom_row(compose, tmp_path, monkeypatch):
    """Even while drawing the workload (before the scenario runs): the impl's row says oom, the job goes on."""
    from kvbench.harness.front.job import run_job
    from kvbench.harness.scenarios import context

    def exhausted(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(context, "draw_workload", exhausted)
    rows, code = run_job(compose(["+impl=paged_torch", "scenario=capacity", "model=tiny-llama"]), tmp_path)
    assert code == 1 and rows[0]["status"] == "oom" and "out of host memory" in rows[0]["error"]
    assert pd.read_csv(tmp_path / "rows.csv").iloc[0].status == "oom"


@pytest.mark.parametrize("where", ["file", "under_file", "proc", "dev_null", "sweep_file"])
def test_an_unusable_run_folder_is_one_line_and_exit_2(tmp_path, where):
    afile = tmp_path / "a-file"
    afile.write_text("not a folder")
    folder = {"file": afile, "under_file": afile / "run", "proc": Path("/proc/self/kvbench-run"),
              "dev_null": Path("/dev/null"), "sweep_file": afile}[where]
    sweep = where == "sweep_file"
    p = harness(*(["-m"] if sweep else []), "+impl=paged_torch", "scenario=capacity",
                *(["batch=1,2", f"hydra.sweep.dir={folder}"] if sweep else [f"hydra.run.dir={folder}"]))
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().count("\n") == 0 and "cannot hold a run folder" in p.stderr and str(folder) in p.stderr
    assert afile.read_text() == "not a folder"


def test_vllm_names_and_impl_without_plus_run_the_same_job(tmp_path):
    """``impl=paged_torch max_num_seqs=4 num_prompts=6`` is ``+impl=paged_torch batch=4 workload.num_requests=6``."""
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    a = harness("+impl=paged_torch", "scenario=capacity", "batch=4", "workload.num_requests=6", f"hydra.run.dir={ours}")
    b = harness("impl=paged_torch", "scenario=capacity", "max_num_seqs=4", "num_prompts=6", f"hydra.run.dir={theirs}")
    assert a.returncode == 0 and b.returncode == 0, b.stderr
    assert "is vLLM's name: taken as batch=4" in b.stderr and "taken as +impl=paged_torch" in b.stderr
    ra, rb = pd.read_csv(ours / "rows.csv").iloc[0], pd.read_csv(theirs / "rows.csv").iloc[0]
    assert (rb.impl, rb.batch, rb.num_requests, rb.job_id) == ("paged_torch", 4, 6, ra.job_id)


@pytest.mark.parametrize("override, expected", [
    ("model=meta-llama/Llama-3.1-8B", "is a Hugging Face hub name, and kvbench never downloads: point model.path="),
    ("model=tiny-lama", "did you mean model=tiny-llama?"),
    ("workload=sharegtp", "did you mean workload=sharegpt?"),
    ("hydra/launcher=jobib", "hydra/launcher=jobib is unknown (no hydra/launcher/jobib.yaml on the config path); "
                             "allowed: basic, joblib, "),  # was "hydra=launcher/jobib is unknown"
])
def test_the_likeliest_mistakes_get_the_best_messages(tmp_path, override, expected):
    p = harness("+impl=paged_torch", "scenario=capacity", override, f"hydra.run.dir={tmp_path}")
    assert p.returncode == 2 and expected in p.stderr and p.stderr.strip().count("\n") == 0, p.stderr


# ---- every refusal is one line and exit 2 (issue 41, "Command line") -------------------------------------

DIGITS = "1" * 5000  # past Python's int max str digits (4300)


@pytest.mark.parametrize("args, row", [
    ([f"batch={DIGITS}"], "."),
    (["-m", f"batch=1,{DIGITS}"], "0"),  # a sweep: its first job's folder gets the row
    (["--cfg", "job", f"batch={DIGITS}"], None),  # shows the config: nothing runs, no row
])
def test_a_number_too_long_for_python_is_one_line_and_exit_2(tmp_path, args, row):
    """Hydra's parser raised a bare ValueError (advising sys.set_int_max_str_digits) as a traceback."""
    where = "hydra.sweep.dir" if "-m" in args else "hydra.run.dir"
    p = harness(*args, "+impl=paged_torch", "scenario=capacity", f"{where}={tmp_path / 'r'}")  # flags first
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0, p.stderr
    assert "batch=" in p.stderr and "5000 digits, out of range" in p.stderr and len(p.stderr) < 300, p.stderr
    if row is None:
        assert not (tmp_path / "r").exists()
    else:
        assert pd.read_csv(tmp_path / "r" / row / "rows.csv").status[0] == "error"


@pytest.mark.parametrize("override, expected", [
    ("batch=${oc.env:KVBENCH_SURELY_UNSET}", "batch: its interpolation cannot be resolved"),  # was Hydra's traceback
    ("workload.prompt_len=1e999", "workload.prompt_len=inf must be a finite number"),  # was an OverflowError
    ("cpu_threads=100000", "cpu_threads=100000 must be in [1, "),
])
def test_values_that_failed_inside_the_run_are_one_line_with_a_row(tmp_path, override, expected):
    scenario = "scenario=decode" if override.startswith("cpu_threads") else "scenario=capacity"
    p = harness("+impl=paged_torch", scenario, "model=tiny-llama", override, f"hydra.run.dir={tmp_path}")
    assert p.returncode == 2 and expected in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert pd.read_csv(tmp_path / "rows.csv").status[0] == "error"


def importable(name: str, cwd: Path) -> str:
    """``python -m harness.report`` runs from the checkout's root; anywhere else the installed name is
    ``kvbench.harness.report`` (pyproject.toml maps the folders under ``kvbench``)."""
    return name if cwd == REPO_ROOT else f"kvbench.{name}"


def module(name: str, *args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", importable(name, cwd), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory) -> Path:
    """A finished capacity run to report on and replay (about 2 s)."""
    folder = tmp_path_factory.mktemp("run") / "r"
    assert harness("+impl=paged_torch", "scenario=capacity", "model=tiny-llama", f"hydra.run.dir={folder}").returncode == 0
    return folder


@pytest.mark.parametrize("name", ["harness.report", "harness.replay"])
@pytest.mark.parametrize("where", ["under_file", "file", "read_only"])
def test_an_out_that_cannot_be_written_is_one_line_and_exit_2(tmp_path, run_folder, name, where):
    """The report ended in a PermissionError (or NotADirectoryError) traceback; the replay too, after its run."""
    afile = tmp_path / "a-file"
    afile.write_text("")
    read_only = tmp_path / "ro"
    read_only.mkdir()
    read_only.chmod(0o555)
    out = {"under_file": afile / "out", "file": afile, "read_only": read_only / "out"}[where]
    try:
        if where == "read_only" and os.geteuid() == 0:
            pytest.skip("root writes into a read-only folder (its parent being a file is the test root cannot pass)")
        p = module(name, str(run_folder), "--out", str(out))
    finally:
        read_only.chmod(0o755)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
    assert f"--out {out} cannot hold the" in p.stderr
    assert afile.read_text() == "" and not any(read_only.iterdir()) and p.stdout == ""


@pytest.mark.parametrize("args", [["--bogus"], []])
@pytest.mark.parametrize("name", ["harness.report", "harness.replay"])
def test_a_usage_error_is_one_line(tmp_path, name, args):
    """argparse printed its usage block first; report without DIRS reads runs/, so it is given one."""
    if name == "harness.report":
        args = [*args, str(tmp_path / "nowhere")]
    p = module(name, *args, cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and p.stderr.startswith(f"python -m {name}: error: ")
    assert p.stderr.rstrip().endswith(f"(see python -m {name} --help)"), p.stderr


def closed_stdout(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -m NAME ARGS | head -1``, head gone before the first write: every write to stdout fails with EPIPE."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([sys.executable, "-m", importable(name, cwd), *args], cwd=cwd, stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=300)
    finally:
        os.close(write)


@pytest.mark.parametrize("name", ["harness.report", "harness.replay"])
def test_a_closed_pipe_ends_the_report_and_the_replay_quietly(tmp_path, run_folder, name):
    """--help (argparse's print and exit) and a real report or replay, whose last lines go nowhere."""
    p = closed_stdout(name, "--help", cwd=tmp_path)
    # argparse itself drops an OSError of its help's write, so the report (which cannot wrap stdout: it imports
    # nothing of the entry points) sees no closed pipe there: quiet, exit 0
    assert p.returncode in (0, 141) and p.stderr == "", p.stderr
    p = closed_stdout(name, str(run_folder), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert p.returncode == 141 and "Traceback" not in p.stderr and "Exception" not in p.stderr, p.stderr
    assert (tmp_path / "out" / ("REPORT.md" if name == "harness.report" else "rows.csv")).is_file()
