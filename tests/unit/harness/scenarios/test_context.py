"""A job's pieces assembled: a scenario gets the pieces its ``run`` names and no others, every piece keeps the one
memo (the parent's, in an isolated impl's process), and a probe gets its own pieces around the parent's model."""

from __future__ import annotations

import copy
import inspect
from types import SimpleNamespace

import pytest

from kvbench.harness.front.job import run_job
from kvbench.harness.front.resolve import resolve
from kvbench.harness.scenarios import module, schemas
from kvbench.harness.scenarios.compute import Compute
from kvbench.harness.scenarios.context import PIECES, JobContext, probe

SMALL = ["+impl=contiguous", "model=tiny-llama", "dtype=float32", "device=cpu", "max_seq_len=64", "batch=2",
         "workload=fixed", "workload.num_requests=3", "workload.prompt_len=8", "workload.output_len=5"]


def _ctx(compose, tmp_path, *overrides: str, **kwargs) -> JobContext:
    no_fingerprint = SimpleNamespace(as_dict=dict)  # the machine's fields are not what is checked here
    return JobContext(resolve(compose([*SMALL, *overrides])), tmp_path, no_fingerprint, **kwargs)


def test_a_scenario_gets_the_pieces_its_run_names(compose, tmp_path):
    ctx = _ctx(compose, tmp_path)
    got = {}

    def run(job, out, impl, warmup=1):
        got.update(job=job, out=out, impl=impl, warmup=warmup)
        return []

    ctx.call(run, ctx.job.cfg.impl, warmup=0)
    assert got == {"job": ctx.job, "out": ctx.out, "impl": ctx.job.cfg.impl, "warmup": 0}


def test_a_run_asking_for_anything_else_is_refused_naming_the_pieces(compose, tmp_path):
    def run(job, model, impl):
        return []

    with pytest.raises(TypeError, match=r"asks for \['model'\]: a scenario receives impl and any of "
                                        r"\['job', 'workload', 'compute', 'budget', 'out'\]"):
        _ctx(compose, tmp_path).call(run, None)


def test_every_scenario_names_only_pieces_and_bookkeeping_never_the_model():
    for name, schema in schemas().items():
        named = set(inspect.signature(module(name).run).parameters) - {"impl"}
        assert named <= set(PIECES) and "job" in named, name
        if schema().bookkeeping:
            assert not named & {"compute", "budget"}, name


def test_a_bookkeeping_job_never_builds_the_model(compose, tmp_path, monkeypatch):
    monkeypatch.setattr(Compute, "model", property(lambda self: pytest.fail("a capacity job built the model")))
    (row,), code = run_job(compose(["+impl=paged_torch", "scenario=capacity", "model=tiny-llama",
                                    "workload.num_requests=4"]), tmp_path)
    assert code == 0, row.get("error")


def test_every_piece_keeps_the_one_memo_it_was_handed(compose, tmp_path):
    memo = {"cpu_threads": 7}
    ctx = _ctx(compose, tmp_path, memo=memo)
    assert ctx.job.memo is ctx.workload.memo is ctx.compute.job.memo is ctx.budget.job.memo is memo
    assert ctx.job.cpu_threads == 7 and ctx.identifiers(ctx.job.cfg.impl)["cpu_threads"] == 7


def test_the_outputs_are_the_lists_and_tables_handed_in(compose, tmp_path):
    """A resumed job's kept tokens and tables: the impls' new ones go into the same objects the folder writes."""
    tokens, tables = [{"impl": "kept"}], {}
    ctx = _ctx(compose, tmp_path, tokens=tokens, tables=tables)
    assert ctx.out.tokens is tokens and ctx.out.tables is tables


def test_a_probe_has_its_own_workload_memo_and_outputs_around_the_parents_model(compose, tmp_path):
    parent = _ctx(compose, tmp_path, memo={"cpu_threads": 1})
    model = parent.compute.model
    cfg = copy.deepcopy(parent.job.cfg)
    cfg.workload.num_requests = 2
    child = probe(parent.job, parent.compute, cfg)
    assert child.compute.model is model and child.budget.compute is child.compute
    assert child.job.memo == {} and child.out.tables == {} and child.out.tokens == []
    assert (child.job.run_dir, child.job.fingerprint) == (parent.job.run_dir, parent.job.fingerprint)
    assert len(child.workload.requests) == 2 and len(parent.workload.requests) == 3
    assert parent.derive(cfg).compute.model is model
