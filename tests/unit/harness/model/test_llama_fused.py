"""The fused element-wise ops in the model (LlamaModel.fuse_elementwise, build_model's default on a CPU at
fp32): the same logits as torch's op-at-a-time path within fp32 rounding, the same greedy tokens through
every CPU impl, torch's path wherever the ops do not apply, and a clear error where they cannot."""

from __future__ import annotations

import pytest
import torch

from kvbench.harness.kv.factory import build_cache
from kvbench.harness.model.config import ModelConfig
from kvbench.harness.model.llama import LlamaModel
from kvbench.harness.model.weights import build_model
from kvbench.harness.serving.engine import Engine
from kvbench.harness.serving.workload import Request
from kvbench.kernels import dense_op

pytestmark = pytest.mark.skipif(dense_op.dense_ops_unavailable() is not None,
                                reason=f"the fused ops did not build: {dense_op.dense_ops_unavailable()}")

# Awkward shapes: a hidden size off the ops' 16-lane sums, GQA 3:1, q/k/v bias (Qwen2), tied embeddings.
SHAPES = {
    "tiny": ModelConfig(num_layers=2),
    "qwen-like": ModelConfig(num_layers=2, hidden_size=120, intermediate_size=200, num_heads=6, num_kv_heads=2,
                             head_dim=20, vocab_size=300, qkv_bias=True, architecture="qwen2",
                             tie_word_embeddings=True),
}


def _attend(layer, q, k, v):
    group = q.shape[1] // v.shape[1]
    return v.repeat_interleave(group, dim=1) + 0.01 * layer * q


def _pair(shape: ModelConfig, seed: int = 3) -> tuple[LlamaModel, LlamaModel]:
    """The same weights (one seed): fused, and torch's element-wise ops (both on packed GEMMs)."""
    return (build_model(shape, torch.float32, "cpu", seed=seed),
            build_model(shape, torch.float32, "cpu", seed=seed, fuse=False))


def test_build_model_fuses_fp32_on_cpu_by_default(monkeypatch):
    shape = SHAPES["tiny"]
    assert build_model(shape, torch.float32, "cpu", seed=0).fused
    assert not build_model(shape, torch.float32, "cpu", seed=0, fuse=False).fused
    assert not build_model(shape, torch.bfloat16, "cpu", seed=0).fused  # the ops take float32 rows
    monkeypatch.setenv("KVBENCH_CPU_FUSED", "0")
    assert not build_model(shape, torch.float32, "cpu", seed=0).fused
    assert build_model(shape, torch.float32, "cpu", seed=0, fuse=True).fused  # explicit wins
    with pytest.raises(ValueError, match="need float32 on a CPU"):
        build_model(shape, torch.bfloat16, "cpu", seed=0).fuse_elementwise()


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("n", [1, 3, 8, 65, 130])
def test_fused_logits_match_torch_ops(name, n, monkeypatch):
    fused, plain = _pair(SHAPES[name])
    gen = torch.Generator().manual_seed(n)
    ids = torch.randint(0, SHAPES[name].vocab_size, (n,), generator=gen)
    pos = torch.randint(0, 500, (n,), generator=gen)
    calls: list[str] = []
    for op in ("rms_norm", "add_rms_norm", "rope_qkv", "silu_mul"):
        real = getattr(dense_op, op)
        monkeypatch.setattr(dense_op, op, lambda *a, _op=op, _real=real: calls.append(_op) or _real(*a))
    with torch.inference_mode():
        want = plain(ids, pos, _attend)
        assert not calls  # torch's path calls none of them
        got = fused(ids, pos, _attend)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=5e-5)
    assert got.argmax(-1).equal(want.argmax(-1))
    layers = SHAPES[name].num_layers
    # a layer: its input norm, RoPE + split, the add before its second norm, SwiGLU; then the final norm
    assert sorted(calls) == sorted(["rms_norm"] * (layers + 1) + ["rope_qkv", "add_rms_norm", "silu_mul"] * layers)


def test_unfuse_goes_back_to_torch_ops(monkeypatch):
    model, plain = _pair(SHAPES["tiny"], seed=5)
    model.fuse_elementwise(False)
    assert not model.fused
    monkeypatch.setattr(dense_op, "rms_norm", lambda *a: pytest.fail("fused op called after unfusing"))
    ids = torch.arange(4)
    with torch.inference_mode():
        assert torch.equal(model(ids, ids, _attend), plain(ids, ids, _attend))


def _requests(vocab: int) -> list[Request]:
    gen = torch.Generator().manual_seed(11)
    shapes = [(13, 9), (5, 3), (21, 12), (9, 6), (70, 4), (3, 7), (11, 10)]  # one prompt past the packed rows
    return [Request(i, tuple(torch.randint(0, vocab, (p,), generator=gen).tolist()), o)
            for i, (p, o) in enumerate(shapes)]


@pytest.mark.parametrize("impl", ["contiguous", "paged_torch", "paged_cuda"])
def test_each_cpu_impl_generates_the_same_tokens_fused(compose, impl):
    from kvbench.harness.front.resolve import resolve

    cfg = resolve(compose([f"+impl={impl}", "model=tiny-llama", "model.num_layers=2", "dtype=float32",
                           "device=cpu", "max_seq_len=96", "block_size=8", "batch=5"]))
    fused = build_model(cfg.model, torch.float32, "cpu", cfg.seed)
    plain = build_model(cfg.model, torch.float32, "cpu", cfg.seed, prepack=False, fuse=False)
    assert fused.fused and not plain.fused

    def tokens(model):
        cache = build_cache(cfg.impl, cfg, 2**21, torch.device("cpu"))
        result = Engine(model, cache, cfg.batch, cfg.max_num_batched_tokens).run(_requests(cfg.model.vocab_size))
        return [(s.request_id, s.output_ids) for s in result.sequences]

    assert tokens(fused) == tokens(plain)


def test_greedy_is_argmax_fused_or_not(monkeypatch):
    fused, plain = _pair(SHAPES["tiny"], seed=9)
    gen = torch.Generator().manual_seed(9)
    logits = torch.randn(6, SHAPES["tiny"].vocab_size, generator=gen)
    logits[2, [10, 400]] = 50.0  # a tie: the first index, as torch
    want = logits.argmax(-1).tolist()
    used = []
    real = dense_op.argmax_rows
    monkeypatch.setattr(dense_op, "argmax_rows", lambda x: used.append(1) or real(x))
    assert plain.greedy(logits) == want and not used
    assert fused.greedy(logits) == want and used
    assert fused.greedy(logits[:, ::2]) == logits[:, ::2].argmax(-1).tolist()  # not contiguous: torch's
