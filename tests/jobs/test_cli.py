"""The CLI as users run it: `python -m harness ...` in a subprocess, its folder and its errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness.results import COLUMNS
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
    from harness.front.job import run_job
    from harness.scenarios import context

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
])
def test_the_likeliest_mistakes_get_the_best_messages(tmp_path, override, expected):
    p = harness("+impl=paged_torch", "scenario=capacity", override, f"hydra.run.dir={tmp_path}")
    assert p.returncode == 2 and expected in p.stderr and p.stderr.strip().count("\n") == 0, p.stderr
