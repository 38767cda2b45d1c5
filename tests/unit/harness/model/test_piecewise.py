"""Decode as pieces around the attention (harness/model/piecewise.py): the CPU runs the pieces
eagerly over the same padded buffers a CUDA graph records; the GPU tests replay real graphs."""

from __future__ import annotations

import json

import pytest
import torch

from kvbench.harness.scenarios.context import JobContext
from kvbench.harness.serving.engine import Engine
from kvbench.harness.errors import ConfigError
from kvbench.harness.model.config import ModelConfig
from kvbench.harness.model.piecewise import PiecewiseDecode, capture_sizes
from kvbench.harness.model.weights import build_model
from kvbench.harness.front.resolve import resolve
from kvbench.harness.front.job import run_job
from kvbench.harness.serving.workload import Request
from kvbench.impls.paged import PagedCache
from kvbench.impls.block_manager import BlockManager
from kvbench.kernels.registry import get_paged_kernel

TINY = ["model=tiny-llama", "dtype=float32", "max_seq_len=128", "scenario.warmup=0"]


@pytest.mark.parametrize("max_batch, sizes", [
    (1, [1]), (3, [1, 2, 3]), (5, [1, 2, 4, 5]), (8, [1, 2, 4, 8]), (20, [1, 2, 4, 8, 16, 20]),
    (32, [1, 2, 4, 8, 16, 24, 32]),
])
def test_capture_sizes_are_vllms(max_batch, sizes):
    assert capture_sizes(max_batch) == sizes


def test_capture_sizes_reject_an_empty_batch():
    with pytest.raises(ValueError, match="max_batch must be >= 1"):
        capture_sizes(0)


@pytest.fixture(scope="module")
def model():
    cfg = ModelConfig(name="t", num_layers=3, hidden_size=64, intermediate_size=96, num_heads=4, num_kv_heads=2,
                      head_dim=16, vocab_size=101)
    return build_model(cfg, torch.float32, torch.device("cpu"), seed=3)


def _self_attention(layer, q, k, v):
    """Each token attends to itself only: its v, one per query head (any function of q, k, v works here)."""
    group = q.shape[1] // v.shape[1]
    return v.repeat_interleave(group, dim=1) + 0.01 * layer * q


@pytest.mark.parametrize("n", [1, 3, 5, 7])
def test_pieces_give_the_models_logits_at_awkward_batch_sizes(model, n):
    pieces = PiecewiseDecode(model, max_batch=7, capture=False)
    gen = torch.Generator().manual_seed(n)
    for _ in range(2):  # a second call reuses the buffers the first one left filled
        ids = torch.randint(0, model.cfg.vocab_size, (n,), generator=gen)
        pos = torch.randint(0, 100, (n,), generator=gen)
        with torch.inference_mode():
            want = model(ids, pos, _self_attention)
            got = pieces(ids, pos, _self_attention)
        assert got.shape == (n, model.cfg.vocab_size)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_attention_sees_only_the_batchs_rows(model):
    pieces = PiecewiseDecode(model, max_batch=8, capture=False)
    seen = []

    def attend(layer, q, k, v):
        seen.append((layer, q.shape[0], k.shape[0], v.shape[0]))
        return _self_attention(layer, q, k, v)

    with torch.inference_mode():
        pieces(torch.arange(5), torch.arange(5), attend)
    assert pieces.padded_size(5) == 8
    assert seen == [(layer, 5, 5, 5) for layer in range(model.cfg.num_layers)]


def test_a_batch_beyond_the_captured_sizes_is_refused(model):
    pieces = PiecewiseDecode(model, max_batch=4, capture=False)
    with pytest.raises(ValueError, match="outside the captured sizes 1..4"):
        pieces.padded_size(5)


def test_capture_needs_a_gpu(model):
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        PiecewiseDecode(model, max_batch=2, capture=True)


def _engine_tokens(model, pieces):
    alloc = BlockManager(num_blocks=64, block_size=8)
    cache = PagedCache(get_paged_kernel("torch"), alloc, num_layers=model.cfg.num_layers, num_heads=4, kv_heads=2,
                       head_dim=16, dtype=torch.float32, device=torch.device("cpu"), bytes_per_token=1)
    engine = Engine(model, cache, max_num_seqs=6, max_num_batched_tokens=512, pieces=pieces)
    gen = torch.Generator().manual_seed(0)
    requests = [Request(i, tuple(torch.randint(0, 101, (5 + 3 * i,), generator=gen).tolist()), 4 + 2 * i, 1)
                for i in range(6)]
    result = engine.run(requests)
    return [s.output_ids for s in result.sequences], result


def test_engine_with_pieces_generates_the_eager_tokens(model):
    """Batches shrink from 6 to 1 as requests finish: every size runs padded to a captured one."""
    eager, eager_result = _engine_tokens(model, None)
    piecewise, result = _engine_tokens(model, PiecewiseDecode(model, max_batch=6, capture=False))
    assert piecewise == eager
    assert eager_result.piecewise_steps == 0
    assert result.piecewise_steps == result.decode_steps > 0


def test_cuda_graph_on_cpu_is_a_config_error(compose, tmp_path):
    rows, code = run_job(compose(["+impl=contiguous", *TINY, "device=cpu", "cuda_graph=true"]), tmp_path)
    assert code == 2
    assert "cuda_graph=true needs a CUDA device" in rows[0]["error"]


@pytest.mark.parametrize("overrides, where", [
    (["scenario=kernel"], "scenario=kernel:"),
    (["scenario=capacity"], "scenario=capacity:"),
    (["scenario=max_concurrency", "scenario.probe=capacity"], "scenario=max_concurrency with scenario.probe=capacity"),
    (["scenario=max_rate", "scenario.probe=capacity", "slo.ttft_ms=100", "arrival=poisson", "gpu=a100-40gb"],
     "scenario=max_rate with scenario.probe=capacity"),
])
def test_cuda_graph_where_no_model_decodes_is_a_config_error(compose, overrides, where):
    """Told on any device (the scope is checked before the device): graphs capture only a model's decode steps."""
    with pytest.raises(ConfigError, match="cuda_graph=true does nothing in ") as err:
        resolve(compose(["+impl=paged_torch", *TINY[:-1], *overrides, "cuda_graph=true"]))
    assert where in str(err.value) and "scenario.probe=decode" in str(err.value)


@pytest.mark.parametrize("overrides", [["scenario=decode"], ["scenario=max_concurrency"],
                                       ["scenario=max_rate", "slo.ttft_ms=100", "arrival=poisson"]])
def test_cuda_graph_where_the_model_decodes_passes_the_scope_check(compose, overrides):
    with pytest.raises(ConfigError, match="cuda_graph=true needs a CUDA device"):  # the CPU's own refusal
        resolve(compose(["+impl=paged_torch", *TINY[:-1], *overrides, "device=cpu", "cuda_graph=true"]))


def _graph_ctx(compose, tmp_path, *overrides: str) -> JobContext:
    """A resolved CPU run with cuda_graph switched on after resolve (on CPU the pieces run eagerly)."""
    cfg = resolve(compose(["+impl=paged_torch", *TINY[:-1], "device=cpu", *overrides]))
    cfg.cuda_graph = True
    return JobContext(cfg, tmp_path, None)


def test_a_probe_of_the_same_batch_shares_the_pieces_and_one_of_another_batch_has_its_own(compose, tmp_path):
    import copy

    ctx = _graph_ctx(compose, tmp_path, "batch=4")
    same = copy.deepcopy(ctx.job.cfg)
    same.arrival.rate = 3.0
    assert "decode_pieces" not in ctx.derive(same).__dict__  # nothing built yet: nothing handed on
    parent = ctx.compute.decode_pieces
    assert ctx.derive(same).compute.decode_pieces is parent
    grown = copy.deepcopy(ctx.job.cfg)
    grown.batch = 8
    own = ctx.derive(grown).compute.decode_pieces
    assert own is not parent and (own.max_batch, parent.max_batch) == (8, 4)
    assert ctx.derive(grown).compute.model is ctx.compute.model  # the model is shared whatever the batch


# --- on a GPU: real captures ------------------------------------------------------------------


@pytest.mark.gpu
def test_graph_replays_give_the_eager_tokens_on_gpu(compose, tmp_path):
    """Every impl, cuda_graph on and off, fp32: the same tokens, every decode step a replay, the pool charged."""
    overrides = ["dtype=float32", "model=tiny-llama", "device=cuda", "isolation=none", "max_seq_len=256", "batch=6",
                 "workload=uniform", "workload.num_requests=9", "workload.prompt_len=40", "workload.output_len=24"]
    eager, code = run_job(compose(overrides), tmp_path / "eager")
    assert code == 0, [r.get("error") for r in eager]
    graphs, code = run_job(compose([*overrides, "cuda_graph=true"]), tmp_path / "graphs")
    assert code == 0, [r.get("error") for r in graphs]
    want = {r["impl"]: r["output_digest"] for r in eager}
    got = {r["impl"]: r["output_digest"] for r in graphs}
    assert got == want and len(set(want.values())) == 1
    for r in graphs:
        assert r["cuda_graph"] and r["piecewise_steps"] == r["decode_steps"] > 0, r["impl"]
        assert r["budget_graph_bytes"] > 0
    tokens = [json.loads(line) for line in (tmp_path / "graphs" / "tokens.jsonl").read_text().splitlines()]
    assert tokens


@pytest.mark.gpu
def test_captured_pieces_match_eager_logits_on_gpu():
    cfg = ModelConfig(name="t", num_layers=4, hidden_size=256, intermediate_size=512, num_heads=8, num_kv_heads=2,
                      head_dim=32, vocab_size=1000)
    model = build_model(cfg, torch.float32, torch.device("cuda"), seed=1)
    pieces = PiecewiseDecode(model, max_batch=24, capture=True)
    assert sorted(pieces.graphs) == [1, 2, 4, 8, 16, 24] and pieces.pool_bytes > 0
    for n in (1, 3, 9, 24):
        ids = torch.randint(0, 1000, (n,), device="cuda")
        pos = torch.randint(0, 200, (n,), device="cuda")
        with torch.inference_mode():
            want = model(ids, pos, _self_attention)
            got = pieces(ids, pos, _self_attention).clone()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_batches_past_vllms_largest_capture_run_eagerly(model):
    pieces = PiecewiseDecode(model, max_batch=600, capture=False)
    assert pieces.max_batch == 512 and pieces.sizes[-2:] == [504, 512]
