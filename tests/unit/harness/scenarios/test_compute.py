"""The compute piece: its cpu_compile (the key, or the auto rule over the run's decode tokens, decided once per
job), the decode mode the rows record, the dense backends, and what a probe of another config keeps of it."""

from __future__ import annotations

import copy

import pytest

from kvbench.harness.errors import ConfigError
from kvbench.harness.front.job import run_job
from kvbench.harness.front.resolve import resolve
from kvbench.harness.model import compiled as compiled_mod
from kvbench.harness.scenarios.compute import Compute
from kvbench.harness.scenarios.job_run import JobRun
from kvbench.harness.scenarios.job_workload import JobWorkload

SMALL = ["+impl=contiguous", "model=tiny-llama", "dtype=float32", "device=cpu", "max_seq_len=64", "batch=2",
         "workload=fixed", "workload.num_requests=3", "workload.prompt_len=8", "workload.output_len=5"]


def _compute(compose, tmp_path, *overrides: str) -> Compute:
    job = JobRun(resolve(compose([*SMALL, *overrides])), tmp_path, None)
    return Compute(job, JobWorkload(job.cfg, job.memo))


def test_null_is_the_auto_rule_over_every_repeats_decode_tokens(compose, tmp_path, monkeypatch):
    seen = []

    def rule(model, device, tokens):
        seen.append(tokens)
        return False, "test"

    monkeypatch.setattr(compiled_mod, "auto_compile", rule)
    compute = _compute(compose, tmp_path, "cpu_compile=null", "repeat=3")
    assert compute.cpu_compile is False and compute.decode_compiled is None
    assert seen == [3 * 5 * 3]  # 3 requests x 5 output tokens x 3 repeats, asked once
    assert compute.cpu_compile is False and len(seen) == 1
    assert compute.job.memo["cpu_compile"] is False  # in the memo that travels to an isolated impl's process
    assert compute.decode_mode_columns() == {"cpu_compile": False, "compile_s": None,
                                             "linear_backend": "kvbench_packed", "elementwise_backend": "fused_cpp"}


def test_a_decision_in_the_memo_is_not_taken_again(compose, tmp_path, monkeypatch):
    """An isolated impl's process gets the parent's memo: its compute takes the job's decision as made."""
    monkeypatch.setattr(compiled_mod, "auto_compile", lambda *a: pytest.fail("decided twice"))
    compute = _compute(compose, tmp_path, "cpu_compile=null")
    compute.job.memo["cpu_compile"] = False
    assert compute.cpu_compile is False


def test_the_default_sweeps_short_runs_stay_eager(compose, tmp_path):
    """The real rule: a run of a few thousand decode tokens does not repay a compile."""
    assert _compute(compose, tmp_path, "cpu_compile=null").cpu_compile is False


def test_true_without_a_cxx_compiler_is_a_config_error(compose, tmp_path, monkeypatch):
    monkeypatch.setattr(compiled_mod, "cxx_compiler", lambda: None)
    with pytest.raises(ConfigError, match="cpu_compile=true needs a C\\+\\+ compiler"):
        _compute(compose, tmp_path, "cpu_compile=true").cpu_compile


def test_a_probe_keeps_the_parents_compiled_forward(compose, tmp_path, monkeypatch):
    monkeypatch.setattr("kvbench.harness.model.compiled.CompiledDecode", lambda model, batch: ("compiled", batch))
    compute = _compute(compose, tmp_path, "cpu_compile=true")
    same = JobRun(copy.deepcopy(compute.job.cfg), tmp_path, None)
    assert "decode_compiled" not in compute.shared_with(same, compute.workload).__dict__  # nothing built yet
    parent = compute.decode_compiled
    grown = JobRun(copy.deepcopy(compute.job.cfg), tmp_path, None)
    grown.cfg.batch = 8
    # the batch dimension is dynamic: any batch shares it
    assert compute.shared_with(grown, JobWorkload(grown.cfg)).decode_compiled is parent


def test_a_probe_shares_the_built_model_and_the_pieces_of_its_own_batch(compose, tmp_path, monkeypatch):
    monkeypatch.setattr("kvbench.harness.model.piecewise.PiecewiseDecode",
                        lambda model, batch, capture: ("pieces", batch))
    compute = _compute(compose, tmp_path)
    compute.job.cfg.cuda_graph = True  # after resolve: on CPU the pieces would run eagerly
    assert compute.decode_pieces == ("pieces", 2)
    same = JobRun(copy.deepcopy(compute.job.cfg), tmp_path, None)
    grown = JobRun(copy.deepcopy(compute.job.cfg), tmp_path, None)
    grown.cfg.batch = 8
    kept, own = (compute.shared_with(j, JobWorkload(j.cfg)) for j in (same, grown))
    assert kept.model is own.model is compute.model
    assert kept.decode_pieces is compute.decode_pieces and own.decode_pieces == ("pieces", 8)


@pytest.mark.parametrize("overrides, message", [
    (["device=cpu", "scenario=kernel"], "cpu_compile=true does nothing in scenario=kernel"),
    (["device=cpu", "scenario=max_concurrency", "scenario.probe=capacity"],
     "does nothing in scenario=max_concurrency with scenario.probe=capacity"),
])
def test_true_where_no_model_decodes_is_a_config_error(compose, overrides, message):
    with pytest.raises(ConfigError, match=message):
        resolve(compose(["+impl=paged_torch", "model=tiny-llama", *overrides, "cpu_compile=true"]))


def test_true_on_a_gpu_is_a_config_error(compose, monkeypatch):
    monkeypatch.setattr("kvbench.harness.front.resolve.cuda_available", lambda: True)
    with pytest.raises(ConfigError, match="cpu_compile=true compiles the CPU decode forward; device=cuda"):
        resolve(compose(["+impl=paged_torch", "model=tiny-llama", "device=cuda", "cpu_compile=true"]))


def test_rows_say_the_run_was_eager(compose, tmp_path):
    (row,), code = run_job(compose([*SMALL, "scenario.warmup=0"]), tmp_path)
    assert code == 0, row.get("error")
    assert row["cpu_compile"] is False and row["compile_s"] is None


@pytest.mark.skipif(compiled_mod.cxx_compiler() is None, reason="inductor's CPU backend needs g++")
def test_a_compiled_job_gives_the_eager_tokens_and_records_its_compile(compose, tmp_path):
    # Two layers: the shape tests/unit/harness/model/test_compiled.py compiles (a process compiles it once).
    common = [*SMALL, "model.num_layers=2", "scenario.warmup=0", "batch=3", "workload.num_requests=4"]
    (eager,), code = run_job(compose(common), tmp_path / "eager")
    assert code == 0, eager.get("error")
    (row,), code = run_job(compose([*common, "cpu_compile=true"]), tmp_path / "compiled")
    assert code == 0, row.get("error")
    assert row["cpu_compile"] is True and row["compile_s"] >= 0
    assert row["output_digest"] == eager["output_digest"]


def test_cpu_prepack_false_runs_torch_linears_and_says_so(compose, tmp_path):
    compute = _compute(compose, tmp_path, "cpu_prepack=false")
    assert not compute.model.packed and compute.decode_mode_columns()["linear_backend"] == "torch"


def test_cpu_fused_false_runs_torch_elementwise_ops_and_says_so(compose, tmp_path):
    compute = _compute(compose, tmp_path, "cpu_fused=false")
    assert not compute.model.fused and compute.decode_mode_columns()["elementwise_backend"] == "torch"
    assert compute.model.packed  # the GEMMs are another key's


@pytest.mark.parametrize("overrides", [["device=cuda"], ["dtype=bfloat16"]])
def test_cpu_fused_true_off_cpu_fp32_is_a_config_error(compose, monkeypatch, overrides):
    monkeypatch.setattr("kvbench.harness.front.resolve.cuda_available", lambda: True)
    with pytest.raises(ConfigError, match="cpu_fused=true runs fused float32 CPU ops; device=.* leave it null"):
        resolve(compose(["+impl=paged_torch", "model=tiny-llama", *overrides, "cpu_fused=true"]))
