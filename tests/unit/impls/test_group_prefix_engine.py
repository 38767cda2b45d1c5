"""Prefix hits under kv_manager=hybrid carry the right K/V: a tiny random Gemma 3 checkpoint (five sliding layers
with a 24-token window, one full, one sliding) generates transformers' greedy tokens through the grouped paged
cache with prefix caching on, prompts sharing a 40-token prefix, whole or in chunks (admitted chunk by chunk),
in a pool small enough that cached blocks are evicted (impls/group_prefix.py)."""

from __future__ import annotations

import pytest
import torch

from kvbench.harness.kv.groups import kv_groups
from kvbench.harness.model.config import ModelConfig
from kvbench.harness.serving.engine import Engine
from kvbench.harness.serving.request import Request
from kvbench.impls.base import layer_windows
from kvbench.impls.group_pool import PoolGroup
from kvbench.impls.kinds import PoolSpec, TensorSpec, cache_kind
from tests.helpers.parity import hf_tokens, model_and_hf

pytest.importorskip("transformers")

BLOCK_SIZE, BLOCKS = 8, 72  # 7 groups of one layer: a sequence of at most 80 tokens; a few at once
# (shared prefix tokens, own tokens, output tokens)
SHAPES = [(40, 5, 20), (40, 9, 12), (33, 2, 30), (40, 0, 8), (17, 20, 10), (40, 11, 5)]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    cfg, model, hf = model_and_hf("gemma3-sliding", tmp_path_factory.mktemp("gemma3-prefix"))
    gen = torch.Generator().manual_seed(5)
    shared = torch.randint(0, cfg.vocab_size, (40,), generator=gen).tolist()
    requests = [Request(i, tuple(shared[:p] + torch.randint(0, cfg.vocab_size, (t,), generator=gen).tolist()), o)
                for i, (p, t, o) in enumerate(SHAPES)]
    return cfg, model, requests, hf_tokens(hf, requests)


def _cache(cfg: ModelConfig):
    per_layer = 2 * cfg.num_kv_heads * cfg.head_dim * 4
    groups = kv_groups(cfg, "hybrid")
    spec = PoolSpec(kv_bytes=0, bytes_per_token=per_layer * cfg.num_layers, max_seq_len=128, block_size=BLOCK_SIZE,
                    max_num_seqs=4, min_tokens=1, watermark=0.0, prefix_caching=True,
                    groups=tuple(PoolGroup(g.kind, g.num_layers, g.page_layers, g.pool) for g in groups),
                    pool_kv_bytes=(BLOCKS * BLOCK_SIZE * groups[0].page_layers * per_layer,), layer_bytes=per_layer,
                    group_layers=tuple(g.layers for g in groups))
    tensors = TensorSpec(num_layers=cfg.num_layers, num_heads=cfg.num_heads, kv_heads=cfg.num_kv_heads,
                         head_dim=cfg.head_dim, dtype=torch.float32, device=torch.device("cpu"),
                         scale=cfg.softmax_scale)
    cache = cache_kind("paged").cache(spec, tensors, "torch")
    cache.set_layer_windows(layer_windows(cfg.layer_types, cfg.sliding_window))
    return cache


@pytest.mark.parametrize("chunked", [False, True])
def test_greedy_tokens_equal_transformers_with_prefix_hits(gemma, chunked):
    cfg, model, requests, want = gemma
    cache = _cache(cfg)
    engine = Engine(model, cache, 4, 16 if chunked else 512, chunked_prefill=chunked)
    got = {s.request_id: list(s.output_ids) for s in engine.run(requests).sequences}
    assert got == want
    pool = cache.allocator
    assert pool.cache_hit_tokens >= 3 * 40 // BLOCK_SIZE * BLOCK_SIZE and pool.evicted_blocks > 0
    pool.check_invariants()
