"""DeepSeek-V2/V3, Kimi-K2 and Qwen3-Next read from config.json as transformers derives them (a file saved by
transformers' own config class, and the published layouts with their nulls), the named configs at real size, and
one clear error for what is not supported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvbench.harness.errors import ConfigError
from tests.helpers.checkpoints import read_config as read
from tests.helpers.checkpoints import write_config as write
from kvbench.harness.model.config import ModelConfig
from kvbench.harness.model.hf_config import resolve_model_config
from kvbench.harness.model.support import compute_refusal
from tests.helpers.models import load_named

transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=160, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
            max_position_embeddings=512)
MLA = dict(kv_lora_rank=32, q_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
           n_routed_experts=8, n_shared_experts=2, num_experts_per_tok=2, moe_intermediate_size=20,
           first_k_dense_replace=1)
NEXT = dict(num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=8, linear_value_head_dim=12, linear_conv_kernel_dim=3, num_experts=8,
            num_experts_per_tok=2, moe_intermediate_size=20, shared_expert_intermediate_size=24)


def saved(tmp_path: Path, config_class: str, **keys: Any) -> tuple[Any, ModelConfig]:
    hf = getattr(transformers, config_class)(**{**TINY, **keys})
    hf.save_pretrained(tmp_path)
    return hf, read(tmp_path)


@pytest.mark.parametrize("config_class,arch",
                         [("DeepseekV3Config", "deepseek_v3"), ("DeepseekV2Config", "deepseek_v2")])
@pytest.mark.parametrize("q_lora", [24, None])
def test_deepseek_fields_are_transformers(tmp_path: Path, config_class: str, arch: str, q_lora: int | None) -> None:
    hf, cfg = saved(tmp_path, config_class, **{**MLA, "q_lora_rank": q_lora})
    assert cfg.architecture == arch
    assert cfg.head_dim == hf.head_dim == hf.qk_rope_head_dim  # transformers' __post_init__
    for key in ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                "first_k_dense_replace", "n_shared_experts", "num_experts_per_tok", "moe_intermediate_size"):
        assert getattr(cfg, key) == getattr(hf, key), key
    assert cfg.num_experts == hf.n_routed_experts and cfg.norm_topk_prob == bool(hf.norm_topk_prob)
    assert cfg.layer_types is None  # every layer caches a latent
    assert (cfg.n_group, cfg.topk_group) == ((hf.n_group, hf.topk_group) if arch == "deepseek_v3" else (1, 1))
    assert cfg.routed_scaling_factor == hf.routed_scaling_factor
    assert compute_refusal(cfg) is None  # harness/model/deepseek.py computes it


def test_kimi_k2s_model_type_reads_as_deepseek_v3(tmp_path: Path) -> None:
    """Kimi-K2's published file: model_type kimi_k2, DeepSeek-V3's class; yarn RoPE in the rope_scaling layout."""
    raw = {**TINY, **MLA, "model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"], "n_group": 1,
           "rope_theta": 50000.0, "rope_scaling": {"type": "yarn", "factor": 32.0, "beta_fast": 1.0, "beta_slow": 1.0,
                                                   "mscale": 1.0, "mscale_all_dim": 1.0,
                                                   "original_max_position_embeddings": 4096}}
    cfg = read(write(tmp_path, raw))
    assert cfg.architecture == "deepseek_v3" and cfg.rope_scaling.rope_type == "yarn"
    assert cfg.rope_scaling.factor == 32.0 and cfg.rope_scaling.beta_fast == 1.0 and cfg.rope_theta == 50000.0


def test_v2_lite_layout_with_a_null_q_lora_rank(tmp_path: Path) -> None:
    raw = {**TINY, **MLA, "model_type": "deepseek_v2", "q_lora_rank": None, "num_key_value_heads": 4}
    assert read(write(tmp_path, raw)).q_lora_rank is None
    raw.pop("num_experts_per_tok")  # DeepseekV2Config's default is null
    with pytest.raises(ConfigError, match="num_experts_per_tok=None"):
        read(write(tmp_path, raw))


def test_qwen3_next_fields_are_transformers(tmp_path: Path) -> None:
    hf, cfg = saved(tmp_path, "Qwen3NextConfig", **NEXT, num_hidden_layers=8)
    assert cfg.architecture == "qwen3_next" and cfg.layer_types == hf.layer_types
    assert cfg.layer_types == (["linear_attention"] * 3 + ["full_attention"]) * 2
    for key in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                "linear_conv_kernel_dim", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                "shared_expert_intermediate_size", "head_dim", "num_kv_heads"):
        assert getattr(cfg, key) == getattr(hf, {"num_kv_heads": "num_key_value_heads"}.get(key, key)), key
    assert cfg.qk_norm and compute_refusal(cfg) is None  # computed: harness/model/qwen3_next.py
    assert cfg.partial_rotary_factor == hf.rope_parameters["partial_rotary_factor"] == 0.25


def test_qwen3_next_interval_without_layer_types(tmp_path: Path) -> None:
    raw = {**TINY, **NEXT, "model_type": "qwen3_next", "num_hidden_layers": 6, "full_attention_interval": 2}
    assert read(write(tmp_path, raw)).layer_types == ["linear_attention", "full_attention"] * 3


@pytest.mark.parametrize("change,match", [
    ({"layer_types": ["linear_attention", "sliding_attention", "linear_attention", "full_attention"]},
     r"layer_types\[1\]='sliding_attention'.*allowed: linear_attention, full_attention"),
    ({"mlp_only_layers": [0]}, "mlp_only_layers"),
    ({"linear_num_value_heads": 3}, "multiple of linear_num_key_heads"),
    ({"linear_conv_kernel_dim": 0}, "linear_conv_kernel_dim=0"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 1e-4}},
     r"partial_rotary_factor=0.0001: RoPE must rotate an even number of dims"),
])
def test_qwen3_next_refusals_name_the_key(tmp_path: Path, change: dict, match: str) -> None:
    raw = {**TINY, **NEXT, "model_type": "qwen3_next", **change}
    with pytest.raises(ConfigError, match=match):
        read(write(tmp_path, raw))


PUBLISHED = {  # name: (architecture, layers, kv_lora_rank, linear layers)
    "deepseek-v3": ("deepseek_v3", 61, 512, 0), "kimi-k2": ("deepseek_v3", 61, 512, 0),
    "deepseek-v2-lite": ("deepseek_v2", 27, 512, 0), "qwen3-next-80b-a3b": ("qwen3_next", 48, 0, 36)}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_named_configs_load_for_sizing_only(name: str) -> None:
    cfg = resolve_model_config(load_named(name))
    arch, layers, latent, linear = PUBLISHED[name]
    assert (cfg.architecture, cfg.num_layers, cfg.kv_lora_rank) == (arch, layers, latent)
    assert sum(t == "linear_attention" for t in cfg.layer_types or ()) == linear
    # every family here is computed token for token now (harness/model/deepseek.py, qwen3_next.py)
    assert compute_refusal(cfg) is None
    assert cfg.partial_rotary_factor == (0.25 if arch == "qwen3_next" else 1.0)
