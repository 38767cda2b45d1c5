"""KV-cache groups of the models whose caches are not K and V per head: an MLA model is one latent group under
every manager, Qwen3-Next's linear layers are state groups cut as the full ones (a run under uniform, split_pools
or in a contiguous lane is refused, naming what can), and a caching layer's bytes count only the layers that keep
tokens."""

from __future__ import annotations

import pytest

from kvbench.harness.errors import ConfigError
from kvbench.harness.kv.groups import (
    groups_label, has_one_kind, kv_groups, layer_bytes_per_token, sequence_holding, split_pool_bytes, state_refusal,
)
from kvbench.harness.model.hf_config import resolve_model_config
from kvbench.impls.attention_kinds import LatentAttention, LinearState
from tests.helpers.models import load_named


def named(name: str):
    return resolve_model_config(load_named(name))


@pytest.mark.parametrize("manager", ["uniform", "hybrid", "split_pools"])
def test_an_mla_model_is_one_latent_group(manager: str) -> None:
    v3 = named("deepseek-v3")
    groups = kv_groups(v3, manager)
    assert has_one_kind(v3) and len(groups) == 1 and groups_label(groups) == "latent:61"
    assert groups[0].kind == LatentAttention(512, 64) and groups[0].kind.values_per_token == 576
    assert layer_bytes_per_token(v3, "bfloat16") == 576 * 2


def test_qwen3_next_under_hybrid_full_group_first_then_three_state_groups() -> None:
    m = named("qwen3-next-80b-a3b")
    groups = kv_groups(m, "hybrid")
    assert groups_label(groups) == "full:12,linear:36" and not has_one_kind(m)
    assert [g.kind.label for g in groups] == ["full", "linear", "linear", "linear"]
    assert all(g.num_layers == g.page_layers == 12 for g in groups)
    assert groups[1].kind == LinearState(536)
    assert groups[0].layers == tuple(range(3, 48, 4))
    assert layer_bytes_per_token(m, "bfloat16") == 2 * 2 * 256 * 2  # a full layer's K and V: the pool's slot


def test_a_32k_sequence_of_qwen3_next_holds_its_state_in_whole_pages() -> None:
    m = named("qwen3-next-80b-a3b")
    groups, layer = kv_groups(m, "hybrid"), layer_bytes_per_token(m, "bfloat16")
    h = sequence_holding(groups, 32_768, 16, layer)
    assert h.pages == (2048, 34, 34, 34)
    state_pages = 3 * 34 * 16 * 12 * layer
    assert h.page_bytes == 32_768 * 12 * layer + state_pages
    assert h.needed_bytes == 32_768 * 12 * layer + 3 * 536 * 12 * layer  # the state rounded to whole slots
    assert h.rounding_bytes == 3 * (544 - 536) * 12 * layer  # padding of the state's last page


@pytest.mark.parametrize("manager,cache,why", [
    ("uniform", "paged", "kv_manager=uniform caches every layer as full attention"),
    ("split_pools", "paged", "kv_manager=split_pools would need a static state pool"),
    ("hybrid", "contiguous", "impl.cache=contiguous: its lanes hold K/V per token"),
])
def test_only_hybrids_grouped_pool_holds_a_state(manager: str, cache: str, why: str) -> None:
    m = named("qwen3-next-80b-a3b")
    assert why in state_refusal(m, manager, cache) and "allowed: a paged impl" in state_refusal(m, manager, cache)
    assert state_refusal(m, "hybrid", "paged") is None
    assert state_refusal(named("deepseek-v3"), "uniform", "contiguous") is None  # a latent is K/V-like
    assert groups_label(kv_groups(m, manager)) == "full:12,linear:36"  # the rows still say what it is


def test_split_pools_refuses_to_size_a_state_pool() -> None:
    m = named("qwen3-next-80b-a3b")
    groups = kv_groups(m, "split_pools")
    assert [g.pool for g in groups] == [0, 1]
    with pytest.raises(ConfigError, match="split_pools with linear_attention layers.*allowed: kv_manager=hybrid"):
        split_pool_bytes(groups, 10**10, 0.8, layer_bytes_per_token(m, "bfloat16"))
