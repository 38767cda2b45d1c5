"""The decode forward compiled as one inductor graph (harness/model/compiled.py): the same logits and
tokens as eager, every cache's own attention called inside it, and the auto rule as documented.

One frozen compile (the default on a CPU at fp32) serves most of the module (a module fixture), and one
unfrozen compile the tests of that mode: a compile is ~3-6 s with a warm inductor cache, ~25 s cold, so
the rest of the suite runs with cpu_compile=false (tests/conftest.py).
"""

from __future__ import annotations

import pytest
import torch
from hydra import compose as hydra_compose
from hydra import initialize_config_dir

from kvbench.harness.front.resolve import resolve
from kvbench.harness.front.schemas import register_configs
from kvbench.harness.kv.factory import build_cache
from kvbench.harness.model import compiled as compiled_mod
from kvbench.harness.model.compiled import AUTO_MIN_DECODE_TOKENS, CompiledDecode, auto_compile
from kvbench.harness.model.weights import build_model
from kvbench.harness.serving.engine import Engine
from kvbench.harness.serving.workload import Request
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.skipif(compiled_mod.cxx_compiler() is None, reason="inductor's CPU backend needs g++")

# tiny-llama's shape with two layers: the compile is what the test pays for.
SMALL = ["model=tiny-llama", "model.num_layers=2", "dtype=float32", "device=cpu", "max_seq_len=64", "block_size=8",
         "batch=5", "cpu_compile=false"]


def _cfg(impl: str):
    register_configs()
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base=None):
        return resolve(hydra_compose("config", overrides=["progress=false", f"+impl={impl}", *SMALL]))


@pytest.fixture(scope="module")
def model():
    cfg = _cfg("contiguous")
    return build_model(cfg.model, torch.float32, torch.device("cpu"), cfg.seed)


@pytest.fixture(scope="module")
def plain_model():
    """The same weights with plain F.linear and torch's element-wise ops everywhere: the eager reference."""
    cfg = _cfg("contiguous")
    return build_model(cfg.model, torch.float32, torch.device("cpu"), cfg.seed, prepack=False, fuse=False)


@pytest.fixture(scope="module")
def compiled(model):
    from torch._dynamo.utils import counters

    before = counters["inductor"]["mkldnn_linear_weight_pack_matcher_count"]
    graph = CompiledDecode(model, max_batch=5)
    graph.packed_linears = counters["inductor"]["mkldnn_linear_weight_pack_matcher_count"] - before
    return graph


@pytest.fixture(scope="module")
def unfrozen(model):
    return CompiledDecode(model, max_batch=5, freeze=False)


def _self_attention(layer, q, k, v):
    group = q.shape[1] // v.shape[1]
    return v.repeat_interleave(group, dim=1) + 0.01 * layer * q


@pytest.mark.parametrize("n", [1, 2, 3, 7, 19])
def test_compiled_logits_match_eager_at_awkward_batch_sizes(model, compiled, n):
    gen = torch.Generator().manual_seed(n)
    ids = torch.randint(0, model.cfg.vocab_size, (n,), generator=gen)
    pos = torch.randint(0, 60, (n,), generator=gen)
    with torch.inference_mode():
        want = model(ids, pos, _self_attention)
        got = compiled(ids, pos, _self_attention)
    assert got.shape == (n, model.cfg.vocab_size)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_attention_sees_each_layer_and_the_batchs_rows(model, compiled):
    seen = []

    def attend(layer, q, k, v):
        seen.append((layer, q.shape, k.shape, v.shape))
        return _self_attention(layer, q, k, v)

    with torch.inference_mode():
        compiled(torch.arange(6), torch.arange(6), attend)
    cfg = model.cfg
    assert seen == [(layer, (6, cfg.num_heads, cfg.head_dim), (6, cfg.num_kv_heads, cfg.head_dim),
                     (6, cfg.num_kv_heads, cfg.head_dim)) for layer in range(cfg.num_layers)]


def test_an_attention_returning_its_query_is_copied_not_aliased(model, compiled):
    """A custom op may not return a view of its input: q itself comes back as a copy."""
    with torch.inference_mode():
        want = model(torch.arange(4), torch.arange(4), lambda layer, q, k, v: q)
        got = compiled(torch.arange(4), torch.arange(4), lambda layer, q, k, v: q)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_the_op_outside_a_compiled_forward_is_an_error():
    q = torch.zeros(2, 4, 8)
    with pytest.raises(RuntimeError, match="only inside CompiledDecode"):
        torch.ops.kvbench_model.cache_attention(0, q, q[:, :2], q[:, :2])


def _requests(vocab: int) -> list[Request]:
    """Lengths that make the batch shrink step by step, down to one sequence (which runs eagerly)."""
    gen = torch.Generator().manual_seed(7)
    shapes = [(13, 9), (5, 3), (21, 12), (9, 6), (17, 4), (3, 7), (11, 10)]
    return [Request(i, tuple(torch.randint(0, vocab, (p,), generator=gen).tolist()), o)
            for i, (p, o) in enumerate(shapes)]


def _tokens(model, impl: str, compiled: CompiledDecode | None):
    cfg = _cfg(impl)
    cache = build_cache(cfg.impl, cfg, 2**21, torch.device("cpu"))
    result = Engine(model, cache, cfg.batch, cfg.max_num_batched_tokens, compiled=compiled).run(
        _requests(model.cfg.vocab_size))
    return [(s.request_id, s.output_ids) for s in result.sequences], result.decode_steps


@pytest.mark.parametrize("impl", ["contiguous", "paged_torch", "paged_cuda"])
def test_each_cpu_impl_generates_the_eager_tokens_compiled(model, plain_model, compiled, unfrozen, impl):
    """Each cache's own attention (SDPA over lanes, the torch gather, the C++ kernel) runs inside the graph;
    the frozen graph (packed GEMMs), the unfrozen one, packed eager and plain eager give the same tokens."""
    eager, steps = _tokens(plain_model, impl, None)
    assert _tokens(model, impl, None) == (eager, steps)  # eager on pre-packed weights
    for graph in (compiled, unfrozen):
        before = graph.steps
        got, compiled_steps = _tokens(model, impl, graph)
        assert got == eager
        assert compiled_steps == steps and 0 < graph.steps - before < steps  # the one-sequence steps ran eagerly


def test_the_default_graph_is_frozen_with_packed_linears(model, compiled, unfrozen):
    """freezing: inductor swaps every linear (4 per layer and the logits) for a packed oneDNN GEMM;
    the unfrozen graph of the same model is a compile of its own, not the frozen one reused."""
    assert compiled.freeze and not unfrozen.freeze
    assert compiled.packed_linears == 4 * model.cfg.num_layers + 1
    assert unfrozen.compile_s > 0.2  # compiled, not a cache hit on the frozen graph
    ids = torch.arange(3)
    with torch.inference_mode():
        torch.testing.assert_close(unfrozen(ids, ids, _self_attention), compiled(ids, ids, _self_attention),
                                   rtol=1e-4, atol=1e-4)


def test_a_weight_changed_after_freezing_is_an_error():
    """The frozen graph holds the weights as compiled: an in-place change is refused, not silently ignored."""
    small = build_model(_cfg("contiguous").model.__class__(num_layers=1, vocab_size=256, hidden_size=64,
                                                            intermediate_size=128, num_heads=2, num_kv_heads=1),
                        torch.float32, torch.device("cpu"), 0)
    graph = CompiledDecode(small, max_batch=4)
    with torch.no_grad():
        small.lm_head.weight.mul_(2.0)
    with torch.inference_mode(), pytest.raises(RuntimeError, match="froze"):
        graph(torch.arange(3), torch.arange(3), _self_attention)


def test_auto_rule(model, plain_model, monkeypatch):
    """On for a small fp32 model on CPU with g++ and a long run whose eager forward is torch's; off, saying
    why, for each other case, and for build_model's default (kvbench's GEMM and fused ops: faster eager)."""
    cpu = torch.device("cpu")
    if model.fused and model.packed_kind == "kvbench":
        assert "faster than the compiled graph" in auto_compile(model, cpu, 10**9)[1]
    model = plain_model
    assert auto_compile(model, cpu, AUTO_MIN_DECODE_TOKENS)[0]
    short = auto_compile(model, cpu, AUTO_MIN_DECODE_TOKENS - 1)
    assert not short[0] and "would not repay" in short[1]
    assert not auto_compile(model, torch.device("cuda"), 10**9)[0]
    bf16 = build_model(model.cfg, torch.bfloat16, cpu, 0)
    assert "float32 only" in auto_compile(bf16, cpu, 10**9)[1]
    monkeypatch.setattr(compiled_mod, "AUTO_MAX_PARAMS", 1000)
    assert "parameters >" in auto_compile(model, cpu, 10**9)[1]
    monkeypatch.setattr(compiled_mod, "AUTO_MAX_PARAMS", 10**9)
    monkeypatch.setattr(compiled_mod, "cxx_compiler", lambda: None)
    assert "no C++ compiler" in auto_compile(model, cpu, 10**9)[1]


def test_cxx_compiler_honours_cxx(monkeypatch):
    monkeypatch.setenv("CXX", "g++")
    assert compiled_mod.cxx_compiler() == "g++"
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    monkeypatch.setattr(compiled_mod.shutil, "which", lambda name: None)
    assert compiled_mod.cxx_compiler() is None


def test_a_model_off_the_cpu_is_refused(model, monkeypatch):
    monkeypatch.setattr(type(model), "device", property(lambda self: torch.device("cuda")))
    with pytest.raises(ValueError, match="compiles for a CPU"):
        CompiledDecode(model, 4)
