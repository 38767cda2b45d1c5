"""KV-cache groups per kv_manager, and what one sequence holds under each (the issue's Gemma-3 figures)."""

from __future__ import annotations

import pytest

from kvbench.harness.kv.groups import (
    KV_MANAGERS, groups_label, has_one_kind, kv_groups, layer_bytes_per_token, sequence_holding, split_pool_bytes,
)
from kvbench.harness.model.config import ModelConfig


def gemma3_27b() -> ModelConfig:
    types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(62)]
    return ModelConfig(name="gemma-3-27b", num_layers=62, num_kv_heads=16, head_dim=128, layer_types=types,
                       sliding_window=1024)


def test_gemma3_at_32k_tokens_holds_what_the_issue_says():
    m = gemma3_27b()
    layer = layer_bytes_per_token(m, "bfloat16")
    held = {mgr: sequence_holding(kv_groups(m, mgr), 32768, 16, layer) for mgr in KV_MANAGERS}
    assert held["uniform"].page_bytes / 1e9 == pytest.approx(16.64, abs=0.005)
    assert held["split_pools"].page_bytes / 1e9 == pytest.approx(3.12, abs=0.005)
    assert held["hybrid"].needed_bytes == held["split_pools"].page_bytes
    # hybrid's 6 sliding groups of 10 page layers carry 8 layers of padding in the last one
    assert held["hybrid"].page_bytes == held["split_pools"].page_bytes + 64 * 16 * 8 * layer
    assert held["hybrid"].padding_bytes == 64 * 16 * 8 * layer and held["hybrid"].rounding_bytes == 0
    # at 1000 tokens no layer slides yet: padding is hybrid's only cost over uniform; 1000 = 62.5 blocks of 16
    short = {mgr: sequence_holding(kv_groups(m, mgr), 1000, 16, layer) for mgr in KV_MANAGERS}
    assert short["hybrid"].page_bytes > short["uniform"].page_bytes == short["split_pools"].page_bytes
    assert short["uniform"].rounding_bytes == 8 * 62 * layer


def test_hybrid_groups_have_one_page_size_and_the_label_counts_layers_per_kind():
    m = gemma3_27b()
    hybrid = kv_groups(m, "hybrid")
    assert [g.page_layers for g in hybrid] == [10] * 7 and sum(g.num_layers for g in hybrid) == 62
    assert {g.pool for g in hybrid} == {0}
    assert groups_label(hybrid) == groups_label(kv_groups(m, "split_pools")) == "full:10,sliding1024:52"
    assert groups_label(kv_groups(m, "uniform")) == "full:62"
    # kinds within 1.25x of each other share the largest count (gpt-oss: 18 and 18)
    oss = ModelConfig(num_layers=36, layer_types=["sliding_attention", "full_attention"] * 18, sliding_window=128)
    assert [g.page_layers for g in kv_groups(oss, "hybrid")] == [18, 18]


def test_one_kind_is_one_group_under_every_manager():
    m = ModelConfig()
    assert has_one_kind(m)
    assert {repr(kv_groups(m, mgr)) for mgr in KV_MANAGERS} == {repr(kv_groups(m, "uniform"))}


def test_split_pool_bytes_follow_the_ratio():
    m = gemma3_27b()
    groups = kv_groups(m, "split_pools")
    pools = dict(zip((g.kind.label for g in groups), split_pool_bytes(groups, 10**10, 0.5, 100)))
    full, sliding = pools["full"], pools["sliding1024"]
    assert full + sliding <= 10**10 and sliding / 52 == pytest.approx(0.5 * full / 10, rel=1e-6)


def test_an_unknown_layer_type_names_the_layer_and_the_kinds():
    m = ModelConfig(layer_types=["full_attention", "full_attention", "mamba", "full_attention"])
    with pytest.raises(ValueError, match=r"layer 2: attention kind 'mamba' is not supported; supported: "
                                         r"full_attention, sliding_attention"):
        kv_groups(m, "hybrid")
    with pytest.raises(ValueError, match="kv_manager='paged' is not allowed; allowed: uniform, hybrid, split_pools"):
        kv_groups(ModelConfig(), "paged")
