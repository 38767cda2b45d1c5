"""Grouped KV caches token for token: the sliding-window checkpoints of test_engine_parity_window.py (Mistral: every
layer sliding; Qwen2/Qwen3: layer 0 full, the rest sliding; a 24-token window) generate transformers' greedy tokens
through GroupedPagedCache under kv_manager=hybrid and split_pools, where a sliding group's blocks are freed as they
leave the window, with prompts and generations longer than the window, whole and in chunks across its edge; and so
do the Gemma 3 (its own softmax scale) and gpt-oss (sinks on every layer) checkpoints."""

from __future__ import annotations

import pytest
import torch

from kvbench.harness.serving.engine import Engine
from kvbench.harness.serving.request import Request
from kvbench.impls.group_pool import NULL
from kvbench.impls.grouped_paged import GroupedPagedCache
from tests.helpers.models import GEMMA3_CASES, GPT_OSS_CASES, WINDOW_CASES
from tests.helpers.parity import SHAPES, family_fixture, model_and_hf
from tests.helpers.parity import generate as _generate
from tests.helpers.parity import grouped_cache as _grouped_cache
from tests.helpers.parity import hf_tokens as _hf_tokens
from tests.helpers.parity import random_requests as _requests
from tests.helpers.parity import uniform_cache as _cache

pytest.importorskip("transformers")


class _Dropping:
    """Counts the NULL entries of the cache's tables after each decode step: the windows did free blocks."""

    def __init__(self, cache: GroupedPagedCache) -> None:
        self.nulls = 0
        real = cache.prepare_decode

        def spy(seq_ids, staging=None):
            self.nulls += sum(t.count(NULL) for ts in cache.allocator.tables.values() for t in ts)
            return real(seq_ids, staging)

        cache.prepare_decode = spy


family = family_fixture(WINDOW_CASES)


@pytest.mark.parametrize("manager", ["hybrid", "split_pools"])
@pytest.mark.parametrize("kernel,block_size", [("torch", 8), ("cuda", 1), ("cuda", 16)])
def test_greedy_tokens_equal_transformers(family, manager, kernel, block_size):
    cfg, model, _, requests, want = family
    cache = _grouped_cache(cfg, manager, kernel, block_size)
    dropping = _Dropping(cache)
    assert _generate(model, cache, requests) == want
    assert dropping.nulls > 0


@pytest.mark.parametrize("manager", ["hybrid", "split_pools"])
def test_chunked_prefill_across_the_window_edge(family, manager):
    cfg, model, _, requests, want = family
    assert _generate(model, _grouped_cache(cfg, manager, "cuda", 8), requests, chunked=True) == want


@pytest.mark.parametrize("manager", ["hybrid", "split_pools"])
def test_paged_triton_in_the_interpreter(family, manager):
    """Two short requests (Triton's interpreter is slow on CPU), still past the window."""
    cfg, model, hf, _, _ = family
    requests = _requests(cfg.vocab_size, [(30, 4), (20, 8)])
    assert _generate(model, _grouped_cache(cfg, manager, "triton", 8), requests) == _hf_tokens(hf, requests)


def test_the_groups_are_the_models_kinds(family):
    """Qwen's full first layer is its own group; Mistral has one sliding group; split_pools a pool per kind."""
    cfg = family[0]
    for manager in ("hybrid", "split_pools"):
        groups = _grouped_cache(cfg, manager, "torch", 8).allocator.groups
        kinds = {g.kind.window for g in groups}
        assert kinds == ({24} if cfg.architecture == "mistral" else {None, 24})
        if manager == "split_pools":
            assert sorted(g.pool for g in groups) == list(range(len(groups)))


def _samples(model, cache, requests) -> dict[tuple[int, int], list[int]]:
    engine = Engine(model, cache, 8, 512)
    return {(s.request_id, s.sample): list(s.output_ids) for s in engine.run(requests).sequences}


def test_parallel_samples_copy_on_write_as_the_uniform_cache(family):
    """Two samples a prompt share its blocks in every group; each copies the partly filled last block before it
    writes there (a copy-on-write in each group's pages): the tokens are the uniform cache's."""
    cfg, model, _, _, _ = family
    requests = [Request(i, r.prompt_ids, r.output_len, 2) for i, r in enumerate(_requests(cfg.vocab_size, SHAPES[:2]))]
    want = _samples(model, _cache(cfg, "paged_cuda", 8), requests)
    assert want[0, 0] != want[0, 1]  # the samples diverge: each writes its own tokens after the copy
    assert _samples(model, _grouped_cache(cfg, "hybrid", "cuda", 8), requests) == want
    # several pools: each copy names its own (SlotCopy.pool), so the copy lands in that pool's tensors
    assert _samples(model, _grouped_cache(cfg, "split_pools", "cuda", 8), requests) == want


@pytest.fixture(scope="module", params=sorted({**GEMMA3_CASES, **GPT_OSS_CASES}))
def both_kinds(request, tmp_path_factory):
    """(model config, our model, the requests, transformers' tokens) of a Gemma 3 or gpt-oss checkpoint."""
    cfg, model, hf = model_and_hf(request.param, tmp_path_factory.mktemp(request.param))
    if cfg.sliding_window is None:
        pytest.skip(f"{request.param} has no sliding layer")
    requests = _requests(cfg.vocab_size, SHAPES)
    return cfg, model, requests, _hf_tokens(hf, requests)


@pytest.mark.parametrize("manager", ["hybrid", "split_pools"])
def test_gemma3_and_gpt_oss(both_kinds, manager):
    """Both kinds of layer in one model, whole prompts and chunks across the window's edge, through the C++ kernel."""
    cfg, model, requests, want = both_kinds
    assert _generate(model, _grouped_cache(cfg, manager, "cuda", 8), requests) == want
    assert _generate(model, _grouped_cache(cfg, manager, "cuda", 8), requests, chunked=True) == want
