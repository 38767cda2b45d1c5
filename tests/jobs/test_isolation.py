"""isolation=process: each impl in a spawned process; the same tokens, and a crash is that impl's error row."""

from __future__ import annotations

import json

import pytest

from kvbench.harness.errors import ConfigError
from kvbench.harness.front.resolve import resolve
from kvbench.harness.front.job import run_job
from tests.helpers.harness_proc import GATED, rows

SMALL = ["model=tiny-llama", "device=cpu", "dtype=float32", "max_seq_len=32", "workload=fixed", "batch=2",
         "workload.prompt_len=4", "workload.output_len=3", "scenario.warmup=0"]


def test_auto_is_process_on_cuda_only_and_a_bad_value_names_the_key(compose):
    assert resolve(compose(SMALL)).isolation == "none"  # this CPU run
    with pytest.raises(ConfigError, match="isolation='thread' is not allowed; allowed: auto, none, process"):
        resolve(compose([*SMALL, "isolation=thread"]))


def test_an_impl_in_its_own_process_generates_the_same_tokens(compose, tmp_path):
    by = {}
    for isolation in ("none", "process"):
        out = tmp_path / isolation
        got, code = run_job(compose(["+impl=paged_torch", *SMALL, f"isolation={isolation}"]), out)
        assert code == 0 and got[0]["status"] == "ok", got[0].get("error")
        by[isolation] = (got[0]["output_digest"], (out / "tokens.jsonl").read_text())
    assert by["process"] == by["none"]
    assert json.loads(by["process"][1].splitlines()[0])["impl"] == "paged_torch"


def test_a_crash_in_the_impl_process_is_that_impls_error_row(compose, tmp_path, monkeypatch):
    monkeypatch.setenv("KVB_EXIT", "3")  # tests/helpers/gated_kernel.py ends the (child) process at its first call
    got, code = run_job(compose([*GATED, *SMALL, "isolation=process"]), tmp_path)
    assert code == 1
    row = rows(tmp_path).iloc[0]
    assert row.impl == "gated" and row.status == "error" and "exited with code 3" in row.error
    assert got[0]["error"] == row.error
