"""DeepSeek token for token: tiny random DeepSeek-V3 (q latent, interleaved rotary pairs, yarn with both mscale keys,
grouped sigmoid routing with a correction bias, a shared expert after one dense layer) and DeepSeek-V2-Lite-like
(one q_proj, softmax greedy routing, two shared experts) checkpoints generate transformers' greedy tokens through
every impl's cache. Each cache holds MLA's latent as one kv head of kv_lora_rank + qk_rope_head_dim = 80 values,
its V the K store itself (harness/model/deepseek.py's absorbed formulation), built as harness/kv/factory.py builds
it (``cache_tensors``, through tests/helpers/parity.py)."""

from __future__ import annotations

import pytest
import torch

from kvbench.harness.serving.engine import Engine
from tests.helpers.models import DEEPSEEK_CASES
from tests.helpers.parity import family_fixture, serve_on_the_command_line
from tests.helpers.parity import generate, grouped_cache, hf_tokens, random_requests, uniform_cache

pytest.importorskip("transformers")


family = family_fixture(DEEPSEEK_CASES)


def test_the_cache_holds_one_latent_head_stored_once(family):
    cfg = family[0]
    cache = uniform_cache(cfg, "paged_torch", 8)
    assert cfg.kv_lora_rank + cfg.qk_rope_head_dim == 80 and cache.k[0].shape[2:] == (1, 80)
    assert all(v is k for k, v in zip(cache.k, cache.v)) and len(cache.block_stores()) == cfg.num_layers


@pytest.mark.parametrize("impl,block_size", [("contiguous", 0), ("paged_torch", 8), ("paged_cuda", 1),
                                             ("paged_cuda", 16), ("paged_flex", 8)])
def test_greedy_tokens_equal_transformers(family, impl, block_size):
    cfg, model, _, requests, want = family
    assert generate(model, uniform_cache(cfg, impl, block_size or 16), requests) == want


@pytest.mark.parametrize("kernel", ["torch", "cuda"])
def test_kv_manager_hybrid_grouped_pool(family, kernel):
    cfg, model, _, requests, want = family
    assert generate(model, grouped_cache(cfg, "hybrid", kernel, 8), requests) == want


@pytest.mark.parametrize("impl", ["contiguous", "paged_torch", "paged_cuda"])
def test_chunked_prefill(family, impl):
    """Prompts in chunks of at most 16 tokens, mixed with decodes: a chunk's absorbed queries read the latents of
    the earlier chunks from the cache."""
    cfg, model, _, requests, want = family
    assert generate(model, uniform_cache(cfg, impl, 8), requests, chunked=True) == want


def test_decode_in_pieces_as_cuda_graphs_run_it(family):
    """cuda_graph's pieces (harness/model/piecewise.py), run eagerly here (capturing needs a GPU): the pieces' buffers
    hold MLA's absorbed queries and its one latent head, and give the same tokens."""
    from kvbench.harness.model.piecewise import PiecewiseDecode

    cfg, model, _, requests, want = family
    engine = Engine(model, uniform_cache(cfg, "paged_cuda", 8), 4, 512, pieces=PiecewiseDecode(model, 4, capture=False))
    result = engine.run(requests)
    assert {s.request_id: list(s.output_ids) for s in result.sequences} == want and result.piecewise_steps > 0


def test_paged_triton_in_the_interpreter(family):
    """Two short requests (Triton's interpreter is slow on CPU); its tiles pad the 80 latent values to 128."""
    cfg, model, hf, _, _ = family
    requests = random_requests(cfg.vocab_size, [(21, 4), (9, 6)])
    assert generate(model, uniform_cache(cfg, "paged_triton", 8), requests) == hf_tokens(hf, requests)


def test_without_mla_s_softmax_scale_the_tokens_differ(family):
    """The comparison can fail: the same cache at the latent width's scale (80 ** -0.5, not (qk_nope + qk_rope)
    ** -0.5 with yarn's mscale) does not give transformers' tokens."""
    cfg, model, _, requests, want = family
    cache = uniform_cache(cfg, "paged_torch", 8)
    assert cache.scale != 80**-0.5
    cache.scale = 80**-0.5
    assert generate(model, cache, requests) != want


def test_fp8_latent_stays_close(family):
    """kv_dtype=fp8_e4m3 stores the latent in one byte a value (one scale a tensor, shared by K and V: the same
    rows); an 8-bit latent moves the logits, so the tokens are compared for most of each generation only."""
    cfg, model, _, requests, want = family
    cache = uniform_cache(cfg, "paged_torch", 8, kv_dtype="fp8_e4m3")
    assert cache.k[0].dtype == torch.float8_e4m3fn and cache.scales[0].v is cache.scales[0].k
    got = generate(model, cache, requests)
    firsts = sum(got[r][0] == want[r][0] for r in want)
    assert firsts >= len(want) - 1, (got, want)


def test_a_decode_run_from_the_command_line_generates_transformers_tokens(family, compose, tmp_path):
    """``python -m harness +impl=paged_cuda model.path=DIR ...``: the row is ok, its KV bytes a token are the latent's,
    and every request's tokens are transformers' greedy continuation of its prompt."""
    cfg, _, hf, _, _ = family
    row, got, requests = serve_on_the_command_line(compose, tmp_path, cfg, "paged_cuda", 20, 10)
    assert row["kv_bytes_per_token"] == cfg.num_layers * 80 * 4
    assert len(requests) == 3
    assert got == hf_tokens(hf, requests)
