"""Sliding windows token for token: tiny random Mistral and Qwen2/Qwen3 checkpoints (a 24-token window; Qwen's
first layer full, the rest sliding) generate transformers' greedy tokens through every impl's cache, with prompts
and generations longer than the window, whole and in chunks across the window's edge. Every block is kept
(kv_manager=uniform): the window only masks."""

from __future__ import annotations

import pytest

from tests.helpers.models import WINDOW_CASES
from tests.helpers.parity import generate as _generate
from tests.helpers.parity import hf_tokens as _hf_tokens
from tests.helpers.parity import family_fixture, random_requests as _requests, uniform_cache as _cache

pytest.importorskip("transformers")


family = family_fixture(WINDOW_CASES)


def test_the_checkpoints_slide(family):
    cfg = family[0]
    assert cfg.sliding_window == 24 and "sliding_attention" in cfg.layer_types
    if cfg.architecture in ("qwen2", "qwen3"):  # max_window_layers=1: layer 0 attends to everything
        assert cfg.layer_types[0] == "full_attention"


@pytest.mark.parametrize("impl,block_size", [("contiguous", 0), ("paged_torch", 8), ("paged_cuda", 1),
                                             ("paged_cuda", 16), ("paged_flex", 8)])
def test_greedy_tokens_equal_transformers(family, impl, block_size):
    cfg, model, _, requests, want = family
    assert _generate(model, _cache(cfg, impl, block_size or 16), requests) == want


@pytest.mark.parametrize("impl", ["contiguous", "paged_cuda"])
def test_chunked_prefill_across_the_window_edge(family, impl):
    """Prompts in chunks of at most 16 tokens, mixed with decodes: a chunk's queries see the window's keys in the
    cache and in the chunk itself."""
    cfg, model, _, requests, want = family
    assert _generate(model, _cache(cfg, impl, 8), requests, chunked=True) == want


def test_paged_triton_in_the_interpreter(family):
    """Two short requests (Triton's interpreter is slow on CPU), still past the window."""
    cfg, model, hf, _, _ = family
    requests = _requests(cfg.vocab_size, [(30, 4), (20, 8)])
    assert _generate(model, _cache(cfg, "paged_triton", 8), requests) == _hf_tokens(hf, requests)


def test_without_the_windows_the_tokens_differ(family):
    """The comparison can fail: the same caches attending to every key do not give transformers' tokens."""
    cfg, model, _, requests, want = family
    assert _generate(model, _cache(cfg, "paged_torch", 8, windows=False), requests) != want
