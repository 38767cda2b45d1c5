"""The weights of DeepSeek-V2/V3 (and Kimi-K2) and Qwen3-Next: transformers' own count of tiny random models of
each layout (q_lora_rank set and null, dense first layers, shared experts, linear and full layers), and the
published totals at real size."""

from __future__ import annotations

import pytest

from kvbench.harness.kv.sizes import parameter_count, weight_bytes
from kvbench.harness.model.config import ModelConfig
from kvbench.harness.model.hf_config import resolve_model_config
from tests.helpers.models import load_named

transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=160, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
            max_position_embeddings=512)
CASES = {
    "v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
           dict(kv_lora_rank=32, q_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
                n_routed_experts=8, n_shared_experts=2, num_experts_per_tok=2, moe_intermediate_size=20,
                first_k_dense_replace=1, n_group=2, topk_group=1)),
    "v2-lite": ("DeepseekV2Config", "DeepseekV2ForCausalLM",
                dict(kv_lora_rank=32, q_lora_rank=None, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
                     n_routed_experts=8, n_shared_experts=2, num_experts_per_tok=2, moe_intermediate_size=20,
                     first_k_dense_replace=2)),
    "v2-biased": ("DeepseekV2Config", "DeepseekV2ForCausalLM",
                  dict(kv_lora_rank=32, q_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
                       n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=20,
                       attention_bias=True)),
    "qwen3-next": ("Qwen3NextConfig", "Qwen3NextForCausalLM",
                   dict(num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                        linear_key_head_dim=8, linear_value_head_dim=12, linear_conv_kernel_dim=3, num_experts=8,
                        num_experts_per_tok=2, moe_intermediate_size=20, shared_expert_intermediate_size=24)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_parameter_count_is_transformers_count(case: str, tmp_path) -> None:
    config_class, model_class, keys = CASES[case]
    hf_config = getattr(transformers, config_class)(**{**TINY, **keys})
    hf_config.save_pretrained(tmp_path)
    model = getattr(transformers, model_class)(hf_config)
    cfg = resolve_model_config(ModelConfig(path=str(tmp_path)))
    assert parameter_count(cfg) == sum(p.numel() for p in model.parameters())


# The published totals (model cards): DeepSeek-V3 671B without its 14B multi-token-prediction module, DeepSeek-
# V2-Lite 15.7B, Kimi-K2 1.03T (1T, "1.04T" with its MTP-free checkpoint's embeddings), Qwen3-Next-80B 79.7B.
PUBLISHED_B = {"deepseek-v3": 671.0, "deepseek-v2-lite": 15.7, "kimi-k2": 1026.4, "qwen3-next-80b-a3b": 79.67}


@pytest.mark.parametrize("name", sorted(PUBLISHED_B))
def test_real_size_totals(name: str) -> None:
    cfg = resolve_model_config(load_named(name))
    assert parameter_count(cfg) / 1e9 == pytest.approx(PUBLISHED_B[name], rel=2e-3)
    assert weight_bytes(cfg, "bfloat16") == 2 * parameter_count(cfg)
