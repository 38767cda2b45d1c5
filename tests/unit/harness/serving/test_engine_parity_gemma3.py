"""Gemma 3 token for token: a tiny random Gemma3ForCausalLM checkpoint (7 layers: five sliding with a 24-token window,
one full, one sliding; query_pre_attn_scalar 48 against head_dim 64; its own RoPE base on the sliding layers, linear
scaling on the full one; soft-capped logits) generates transformers' greedy tokens through every impl's cache, with
prompts and generations longer than the window, whole and in chunks across the window's edge. Every block is kept
(kv_manager=uniform): the window only masks. The caches take the model's softmax scale (ModelConfig.softmax_scale)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvbench.harness.model.config import ModelConfig
from kvbench.harness.model.hf_config import resolve_model_config
from kvbench.harness.model.weights import build_model
from kvbench.harness.serving.engine import Engine
from kvbench.harness.serving.request import Request
from kvbench.impls.base import KVCache, layer_windows
from kvbench.impls.kinds import PoolSpec, TensorSpec, cache_kind
from tests.helpers.models import make_hf_model

pytest.importorskip("transformers")

MAX_SEQ_LEN = 128
# impl -> (cache kind, kernel), as conf/impl/ names them
IMPLS = {"contiguous": ("contiguous", "sdpa"), "paged_torch": ("paged", "torch"), "paged_cuda": ("paged", "cuda"),
         "paged_triton": ("paged", "triton"), "paged_flex": ("paged", "flex")}
# (prompt, output) lengths: prompts shorter than, across and past the 24-token window, and generations that cross it
SHAPES = [(30, 20), (7, 26), (50, 9), (24, 3)]


def _cache(cfg: ModelConfig, impl: str, block_size: int, scale: float | None = None, windows: bool = True) -> KVCache:
    kind, kernel = IMPLS[impl]
    per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4
    spec = PoolSpec(kv_bytes=4 * MAX_SEQ_LEN * per_token, bytes_per_token=per_token, max_seq_len=MAX_SEQ_LEN,
                    block_size=block_size, max_num_seqs=4, min_tokens=1, watermark=0.0, prefix_caching=False)
    tensors = TensorSpec(num_layers=cfg.num_layers, num_heads=cfg.num_heads, kv_heads=cfg.num_kv_heads,
                         head_dim=cfg.head_dim, dtype=torch.float32, device=torch.device("cpu"),
                         scale=cfg.softmax_scale if scale is None else scale)
    cache = cache_kind(kind).cache(spec, tensors, kernel)
    if windows:
        cache.set_layer_windows(layer_windows(cfg.layer_types, cfg.sliding_window))
    return cache


def _requests(vocab: int, shapes) -> list[Request]:
    gen = torch.Generator().manual_seed(5)
    return [Request(i, tuple(torch.randint(0, vocab, (p,), generator=gen).tolist()), o)
            for i, (p, o) in enumerate(shapes)]


def _generate(model, cache: KVCache, requests: list[Request], chunked: bool = False) -> dict[int, list[int]]:
    engine = Engine(model, cache, 4, 16 if chunked else 512, chunked_prefill=chunked)
    return {s.request_id: list(s.output_ids) for s in engine.run(requests).sequences}


def _hf_tokens(hf, requests: list[Request]) -> dict[int, list[int]]:
    out = {}
    for r in requests:
        ids = torch.tensor([r.prompt_ids])
        with torch.no_grad():
            ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=r.output_len,
                              min_new_tokens=r.output_len, do_sample=False, pad_token_id=0)
        out[r.request_id] = ref[0, ids.shape[1]:].tolist()
    return out


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """(model config, our model, transformers' model, the requests, transformers' tokens)."""
    folder: Path = tmp_path_factory.mktemp("gemma3-sliding")
    hf = make_hf_model("gemma3-sliding", seed=3)
    hf.save_pretrained(folder)
    hf.generation_config.eos_token_id = None
    cfg = resolve_model_config(ModelConfig(path=str(folder)))
    model = build_model(cfg, torch.float32, "cpu", seed=0)
    requests = _requests(cfg.vocab_size, SHAPES)
    return cfg, model, hf, requests, _hf_tokens(hf, requests)


def test_the_checkpoint_reads_as_gemma3_with_both_kinds(gemma):
    cfg = gemma[0]
    assert cfg.architecture == "gemma3_text" and cfg.sliding_window == 24
    assert cfg.layer_types == ["sliding_attention"] * 5 + ["full_attention", "sliding_attention"]
    assert cfg.softmax_scale == 48**-0.5 and cfg.rope_local_theta == 2000.0
    assert cfg.rope_scaling.rope_type == "linear" and cfg.final_logit_softcapping == 30.0


@pytest.mark.parametrize("impl,block_size", [("contiguous", 0), ("paged_torch", 8), ("paged_cuda", 1),
                                             ("paged_cuda", 16), ("paged_flex", 8)])
def test_greedy_tokens_equal_transformers(gemma, impl, block_size):
    cfg, model, _, requests, want = gemma
    assert _generate(model, _cache(cfg, impl, block_size or 16), requests) == want


@pytest.mark.parametrize("impl", ["contiguous", "paged_torch", "paged_cuda"])
def test_chunked_prefill_across_the_window_edge(gemma, impl):
    """Prompts in chunks of at most 16 tokens, mixed with decodes: a chunk's queries see the window's keys in the
    cache and in the chunk itself."""
    cfg, model, _, requests, want = gemma
    assert _generate(model, _cache(cfg, impl, 8), requests, chunked=True) == want


@pytest.mark.parametrize("chunked", [False, True])
def test_paged_triton_in_the_interpreter(gemma, chunked):
    """Two short requests (Triton's interpreter is slow on CPU), still past the window."""
    cfg, model, hf, _, _ = gemma
    requests = _requests(cfg.vocab_size, [(30, 4), (20, 8)])
    assert _generate(model, _cache(cfg, "paged_triton", 8), requests, chunked) == _hf_tokens(hf, requests)


def test_with_head_dims_scale_the_tokens_differ(gemma):
    """The comparison can fail: the same cache scaling the scores by head_dim ** -0.5 (what it did before the model
    gave it its scale) does not give transformers' tokens."""
    cfg, model, _, requests, want = gemma
    assert _generate(model, _cache(cfg, "paged_torch", 8, scale=cfg.head_dim**-0.5), requests) != want


def test_without_the_windows_the_tokens_differ(gemma):
    """Nor do the same caches attending to every key on the sliding layers."""
    cfg, model, _, requests, want = gemma
    assert _generate(model, _cache(cfg, "paged_torch", 8, windows=False), requests) != want
