"""Gemma 3 token for token: a tiny random Gemma3ForCausalLM checkpoint (7 layers: five sliding with a 24-token window,
one full, one sliding; query_pre_attn_scalar 48 against head_dim 64; its own RoPE base on the sliding layers, linear
scaling on the full one; soft-capped logits) generates transformers' greedy tokens through every impl's cache, with
prompts and generations longer than the window, whole and in chunks across the window's edge. Every block is kept
(kv_manager=uniform): the window only masks. The caches take the model's softmax scale (ModelConfig.softmax_scale)."""

from __future__ import annotations

import pytest

from tests.helpers.parity import generate as _generate
from tests.helpers.parity import hf_tokens as _hf_tokens
from tests.helpers.parity import parity_case, random_requests as _requests, uniform_cache as _cache

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """(model config, our model, transformers' model, the requests, transformers' tokens)."""
    return parity_case("gemma3-sliding", tmp_path_factory.mktemp("gemma3-sliding"))


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
