"""gpt-oss token for token: a tiny random checkpoint (sinks on every layer, a 24-token window on every other one, yarn
RoPE, 3 of 8 clamped-SwiGLU experts a token) generates transformers' greedy tokens through every impl's cache, with
prompts and generations longer than the window, whole and in chunks across the window's edge. The engine hands the
model's sinks to the cache (``KVCache.set_layer_sinks``); every block is kept (kv_manager=uniform)."""

from __future__ import annotations

import pytest
import torch

from kvbench.harness.serving.engine import Engine
from tests.helpers.models import GPT_OSS_CASES
from tests.helpers.parity import family_fixture, serve_on_the_command_line
from tests.helpers.parity import generate as _generate
from tests.helpers.parity import hf_tokens as _hf_tokens
from tests.helpers.parity import random_requests as _requests, uniform_cache as _cache

pytest.importorskip("transformers")


family = family_fixture(GPT_OSS_CASES)


def test_the_checkpoint_slides_and_sinks(family):
    cfg, model = family[0], family[1]
    assert cfg.sliding_window == 24 and cfg.layer_types == ["sliding_attention", "full_attention"] * 2
    cache = _cache(cfg, "paged_torch", 8)
    Engine(model, cache, 4, 512)
    assert len(cache.sinks) == cfg.num_layers
    assert all(torch.equal(s, layer.self_attn.sinks) for s, layer in zip(cache.sinks, model.layers))


@pytest.mark.parametrize("impl,block_size", [("contiguous", 0), ("paged_torch", 8), ("paged_cuda", 1),
                                             ("paged_cuda", 16), ("paged_flex", 8)])
def test_greedy_tokens_equal_transformers(family, impl, block_size):
    cfg, model, _, requests, want = family
    assert _generate(model, _cache(cfg, impl, block_size or 16), requests) == want


@pytest.mark.parametrize("impl", ["contiguous", "paged_torch", "paged_cuda"])
def test_chunked_prefill_across_the_window_edge(family, impl):
    """Prompts in chunks of at most 16 tokens, mixed with decodes: a chunk's queries see the window's keys in the
    cache and in the chunk itself, and the sinks in every softmax."""
    cfg, model, _, requests, want = family
    assert _generate(model, _cache(cfg, impl, 8), requests, chunked=True) == want


def test_paged_triton_in_the_interpreter(family):
    """Two short requests (Triton's interpreter is slow on CPU), still past the window."""
    cfg, model, hf, _, _ = family
    requests = _requests(cfg.vocab_size, [(30, 4), (20, 8)])
    assert _generate(model, _cache(cfg, "paged_triton", 8), requests) == _hf_tokens(hf, requests)


def test_decode_in_pieces_as_cuda_graphs_run_it(family):
    """cuda_graph's pieces (harness/model/piecewise.py), run eagerly here (capturing needs a GPU): each layer's
    halves around the cache's attention give the same tokens."""
    from kvbench.harness.model.piecewise import PiecewiseDecode

    cfg, model, _, requests, want = family
    engine = Engine(model, _cache(cfg, "paged_cuda", 8), 4, 512, pieces=PiecewiseDecode(model, 4, capture=False))
    result = engine.run(requests)
    assert {s.request_id: list(s.output_ids) for s in result.sequences} == want and result.piecewise_steps > 0


def test_without_the_sinks_the_tokens_differ(family, monkeypatch):
    """The comparison can fail: the same cache with every sink left out does not give transformers' tokens."""
    cfg, model, _, requests, want = family
    monkeypatch.setattr(model, "layer_sinks", lambda: None)
    assert _generate(model, _cache(cfg, "paged_torch", 8), requests) != want


def test_a_decode_run_from_the_command_line_generates_transformers_tokens(family, compose, tmp_path):
    """``python -m harness +impl=paged_torch model.path=DIR model.weights=path kv_manager=uniform ...``: the row is
    ok and every request's tokens (tokens.jsonl) are transformers' greedy continuation of its prompt."""
    cfg, _, hf, _, _ = family
    _, got, requests = serve_on_the_command_line(compose, tmp_path, cfg, "paged_torch", 30, 12, "kv_manager=uniform")
    assert len(requests) == 3 and all(len(r.prompt_ids) == 30 and r.output_len == 12 for r in requests)
    assert got == _hf_tokens(hf, requests)
