"""JobContext: its cpu_compile (the key, or the auto rule over the run's decode tokens, decided once per job), and
the rows' workload digest."""

from __future__ import annotations

import copy

import pytest

from kvbench.harness.errors import ConfigError
from kvbench.harness.front.job import run_job
from kvbench.harness.front.resolve import resolve
from kvbench.harness.model import compiled as compiled_mod
from kvbench.harness.scenarios.context import JobContext

SMALL = ["+impl=contiguous", "model=tiny-llama", "dtype=float32", "device=cpu", "max_seq_len=64", "batch=2",
         "workload=fixed", "workload.num_requests=3", "workload.prompt_len=8", "workload.output_len=5"]


def _ctx(compose, tmp_path, *overrides: str) -> JobContext:
    return JobContext(resolve(compose([*SMALL, *overrides])), tmp_path, None)


def test_null_is_the_auto_rule_over_every_repeats_decode_tokens(compose, tmp_path, monkeypatch):
    seen = []

    def rule(model, device, tokens):
        seen.append(tokens)
        return False, "test"

    monkeypatch.setattr(compiled_mod, "auto_compile", rule)
    ctx = _ctx(compose, tmp_path, "cpu_compile=null", "repeat=3")
    assert ctx.cpu_compile is False and ctx.decode_compiled is None
    assert seen == [3 * 5 * 3]  # 3 requests x 5 output tokens x 3 repeats, asked once
    assert ctx.cpu_compile is False and len(seen) == 1
    assert ctx.decode_mode_columns() == {"cpu_compile": False, "compile_s": None, "linear_backend": "kvbench_packed",
                                         "elementwise_backend": "fused_cpp"}


def test_the_default_sweeps_short_runs_stay_eager(compose, tmp_path):
    """The real rule: a run of a few thousand decode tokens does not repay a compile."""
    assert _ctx(compose, tmp_path, "cpu_compile=null").cpu_compile is False


def test_true_without_a_cxx_compiler_is_a_config_error(compose, tmp_path, monkeypatch):
    monkeypatch.setattr(compiled_mod, "cxx_compiler", lambda: None)
    with pytest.raises(ConfigError, match="cpu_compile=true needs a C\\+\\+ compiler"):
        _ctx(compose, tmp_path, "cpu_compile=true").cpu_compile


def test_a_probe_keeps_the_parents_compiled_forward(compose, tmp_path, monkeypatch):
    monkeypatch.setattr("kvbench.harness.model.compiled.CompiledDecode", lambda model, batch: ("compiled", batch))
    ctx = _ctx(compose, tmp_path, "cpu_compile=true")
    assert "decode_compiled" not in ctx.derive(copy.deepcopy(ctx.cfg)).__dict__  # nothing built yet
    parent = ctx.decode_compiled
    grown = copy.deepcopy(ctx.cfg)
    grown.batch = 8
    assert ctx.derive(grown).decode_compiled is parent  # the batch dimension is dynamic: any batch shares it


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
    ctx = JobContext(resolve(compose([*SMALL, "cpu_prepack=false"])), tmp_path, None)
    assert not ctx.model.packed and ctx.decode_mode_columns()["linear_backend"] == "torch"


@pytest.mark.parametrize("threads", [None, 3])
def test_a_bookkeeping_row_records_the_configured_threads_without_sampling_the_load(compose, tmp_path, monkeypatch,
                                                                                    threads):
    """A capacity run computes nothing on threads: free_cores' quarter-second sample would only cost a job time."""
    from kvbench.harness.measure import contention

    def sampled(*a, **k):
        raise AssertionError("a bookkeeping job sampled the load")

    monkeypatch.setattr(contention, "free_cores", sampled)
    from types import SimpleNamespace

    no_fingerprint = SimpleNamespace(as_dict=dict)  # the machine's fields are not what is checked here
    extra = [] if threads is None else [f"cpu_threads={threads}"]
    ctx = JobContext(resolve(compose(["scenario=capacity", "model=tiny-llama", "workload.num_requests=4", *extra])),
                     tmp_path, no_fingerprint)
    assert ctx.cfg.scenario.bookkeeping and ctx.identifiers(None)["cpu_threads"] == threads
    timed = JobContext(resolve(compose(SMALL)), tmp_path, no_fingerprint)  # a decode job samples, when not set
    monkeypatch.setattr(contention, "free_cores", lambda *a, **k: 1)
    assert timed.identifiers(None)["cpu_threads"] == 1


def test_a_runs_digest_is_the_drawn_one_in_a_burst_and_its_own_under_arrivals(compose, tmp_path):
    """The digest drawing made stands for the requests only while they all arrive at 0; with arrival times the
    run hashes its own requests (an arrival adds to each record)."""
    from kvbench.harness.serving.workload import workload_digest

    burst = _ctx(compose, tmp_path, "workload=chat", "workload.num_requests=30")
    poisson = _ctx(compose, tmp_path, "workload=chat", "workload.num_requests=30", "arrival=poisson", "arrival.rate=4")
    assert burst.workload.digest == poisson.workload.digest == burst.workload_digest
    assert burst.workload_digest == workload_digest(burst.requests)
    assert poisson.workload_digest == workload_digest(poisson.requests) != burst.workload_digest


def test_cpu_fused_false_runs_torch_elementwise_ops_and_says_so(compose, tmp_path):
    ctx = JobContext(resolve(compose([*SMALL, "cpu_fused=false"])), tmp_path, None)
    assert not ctx.model.fused and ctx.decode_mode_columns()["elementwise_backend"] == "torch"
    assert ctx.model.packed  # the GEMMs are another key's


@pytest.mark.parametrize("overrides", [["device=cuda"], ["dtype=bfloat16"]])
def test_cpu_fused_true_off_cpu_fp32_is_a_config_error(compose, monkeypatch, overrides):
    monkeypatch.setattr("kvbench.harness.front.resolve.cuda_available", lambda: True)
    with pytest.raises(ConfigError, match="cpu_fused=true runs fused float32 CPU ops; device=.* leave it null"):
        resolve(compose(["+impl=paged_torch", "model=tiny-llama", *overrides, "cpu_fused=true"]))
