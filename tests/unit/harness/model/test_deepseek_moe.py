"""harness/model/deepseek_moe.py's routers against transformers' own (DeepseekV3TopkRouter, DeepseekV2TopkRouter) on
random tokens: the same experts and weights, with the groups, the correction bias, the renormalisation and the routed
scaling that each family applies."""

from __future__ import annotations

import pytest
import torch

from kvbench.harness.model.config import ModelConfig
from kvbench.harness.model.deepseek_moe import DeepseekRouter

transformers = pytest.importorskip("transformers")
HIDDEN, EXPERTS, TOKENS = 24, 12, 37


def _routers(arch: str, **keys):
    """(ours, transformers') over the same random float32 weight (and V3's bias)."""
    if arch == "deepseek_v3":
        hf_cfg = transformers.DeepseekV3Config(hidden_size=HIDDEN, num_attention_heads=4, n_routed_experts=EXPERTS,
                                               **keys)
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter as HFRouter
    else:
        hf_cfg = transformers.DeepseekV2Config(hidden_size=HIDDEN, num_attention_heads=4, n_routed_experts=EXPERTS,
                                               **keys)
        from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter as HFRouter
    hf = HFRouter(hf_cfg)
    cfg = ModelConfig(architecture=arch, hidden_size=HIDDEN, num_experts=EXPERTS,
                      num_experts_per_tok=keys["num_experts_per_tok"], n_group=keys.get("n_group") or 1,
                      topk_group=keys.get("topk_group") or 1, topk_method=keys.get("topk_method", "noaux_tc"),
                      routed_scaling_factor=keys["routed_scaling_factor"],
                      norm_topk_prob=keys.get("norm_topk_prob", False))
    ours = DeepseekRouter(cfg, "cpu")
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        hf.weight.copy_(torch.randn(EXPERTS, HIDDEN, generator=gen))
        ours.weight.copy_(hf.weight)
        if arch == "deepseek_v3":
            hf.e_score_correction_bias.copy_(torch.randn(EXPERTS, generator=gen) * 0.3)
            ours.e_score_correction_bias.copy_(hf.e_score_correction_bias)
    return ours, hf


def _sorted(chosen: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's (expert, weight) pairs in expert order (both routers' top-k is unsorted)."""
    order = chosen.argsort(dim=-1)
    return chosen.gather(1, order), weights.gather(1, order)


@pytest.mark.parametrize("arch,keys", [
    ("deepseek_v3", dict(num_experts_per_tok=3, n_group=4, topk_group=2, norm_topk_prob=True,
                         routed_scaling_factor=2.5)),
    ("deepseek_v3", dict(num_experts_per_tok=2, n_group=1, topk_group=1, norm_topk_prob=False,
                         routed_scaling_factor=1.7)),
    ("deepseek_v2", dict(num_experts_per_tok=3, topk_method="greedy", routed_scaling_factor=1.0)),
    ("deepseek_v2", dict(num_experts_per_tok=2, topk_method="group_limited_greedy", n_group=3, topk_group=2,
                         routed_scaling_factor=16.0)),
])
def test_the_router_chooses_and_weighs_as_transformers(arch, keys):
    ours, hf = _routers(arch, **keys)
    x = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(8))
    chosen, weights = ours(x)
    _, hf_weights, hf_chosen = hf(x)
    got, want = _sorted(chosen, weights), _sorted(hf_chosen, hf_weights)
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], rtol=1e-6, atol=1e-7)


def test_the_groups_change_the_choice():
    """The comparison can fail: V3's router with its groups ignored (one group) chooses other experts."""
    keys = dict(num_experts_per_tok=3, n_group=4, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5)
    ours, hf = _routers("deepseek_v3", **keys)
    ours.groups = ours.top_groups = 1
    x = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(8))
    assert not torch.equal(_sorted(*ours(x))[0], _sorted(hf(x)[2], hf(x)[1])[0])
