"""Each family's config.json read as transformers reads it: layer kinds and windows, q/k norms, experts, Gemma's and
gpt-oss's details; published layouts that lean on transformers' defaults; one clear error for what is not supported."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvbench.harness.errors import ConfigError
from tests.helpers.checkpoints import read_config as read
from tests.helpers.checkpoints import write_config as write
from kvbench.harness.model.config import ModelConfig
from kvbench.harness.model.hf_config import resolve_model_config
from tests.helpers.models import HF_CASES, SIZE_CASES, make_hf_model

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("case", ["qwen3", "qwen3-moe", *SIZE_CASES])
def test_fields_match_transformers_config(case: str, tmp_path: Path) -> None:
    """What transformers derives from the saved config.json (layer_types, window, experts ...) is what kvbench reads;
    a folder with only its config.json is enough."""
    hf = make_hf_model(case).config
    hf.save_pretrained(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]
    cfg = read(tmp_path)
    assert cfg.architecture == {**HF_CASES, **SIZE_CASES}[case][0]
    kinds = getattr(hf, "layer_types", None)
    if case == "mistral-window":  # MistralModel slides every layer whenever sliding_window is set
        kinds = ["sliding_attention"] * hf.num_hidden_layers
    if kinds is None or "sliding_attention" not in kinds:
        assert cfg.layer_types is None and cfg.sliding_window is None
    else:
        assert cfg.layer_types == kinds and cfg.sliding_window == hf.sliding_window
    assert cfg.head_dim == getattr(hf, "head_dim", 16) and cfg.num_kv_heads == hf.num_key_value_heads  # Qwen2: 64/4
    assert cfg.qk_norm == (cfg.architecture in ("qwen3", "qwen3_moe", "gemma3_text"))
    if cfg.architecture in ("qwen3_moe", "gpt_oss"):
        assert (cfg.num_experts, cfg.num_experts_per_tok) == (hf.num_local_experts, hf.num_experts_per_tok)
        assert cfg.norm_topk_prob
    else:
        assert cfg.num_experts == 0
    if cfg.architecture == "gemma3_text":
        assert cfg.hidden_act == "gelu_pytorch_tanh" and cfg.tie_word_embeddings
        assert (cfg.query_pre_attn_scalar, cfg.rope_local_theta) == (24.0, 2000.0)
        assert (cfg.final_logit_softcapping, cfg.attn_logit_softcapping) == (30.0, None)
    if cfg.architecture == "gpt_oss":
        assert cfg.attention_sinks and cfg.qkv_bias and cfg.o_bias and cfg.swiglu_limit == hf.swiglu_limit
        assert cfg.rope_scaling is not None and cfg.rope_scaling.rope_type == "yarn"
        assert cfg.expert_dtype == "dtype"  # a random model: no quantization_config


def test_gemma3_nested_text_config(tmp_path: Path) -> None:
    """A vision-language Gemma 3 folder: the language model under text_config, the embeddings tied at the top."""
    text = make_hf_model("gemma3-text").config
    vision = transformers.SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=28, patch_size=14)
    transformers.Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict()).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "gemma3"
    text.save_pretrained(tmp_path / "text")
    nested, flat = read(tmp_path), read(tmp_path / "text")
    assert nested.architecture == flat.architecture == "gemma3_text"
    assert {**vars(nested), "name": "", "path": ""} == {**vars(flat), "name": "", "path": ""}


GEMMA_27B_TEXT = dict(head_dim=128, hidden_size=5376, intermediate_size=21504, model_type="gemma3_text",
                      num_attention_heads=32, num_hidden_layers=62, num_key_value_heads=16, query_pre_attn_scalar=168,
                      rope_scaling={"factor": 8.0, "rope_type": "linear"}, sliding_window=1024)


def test_published_gemma_27b_layout_takes_transformers_defaults(tmp_path: Path) -> None:
    """google/gemma-3-27b-it's config.json omits vocab_size, the RoPE bases and the layer pattern."""
    raw = dict(model_type="gemma3", text_config=GEMMA_27B_TEXT, vision_config={"model_type": "siglip_vision_model"})
    cfg = read(write(tmp_path, raw))
    assert (cfg.vocab_size, cfg.rope_theta, cfg.rope_local_theta, cfg.max_position_embeddings) == (
        262208, 1e6, 1e4, 131072)
    assert cfg.rope_scaling is not None and (cfg.rope_scaling.rope_type, cfg.rope_scaling.factor) == ("linear", 8.0)
    assert cfg.layer_types is not None and cfg.layer_types.count("full_attention") == 10
    hf = transformers.Gemma3TextConfig(**{k: v for k, v in GEMMA_27B_TEXT.items() if k != "model_type"})
    assert cfg.layer_types == hf.layer_types and cfg.sliding_window == hf.sliding_window == 1024


def test_published_gpt_oss_mxfp4(tmp_path: Path) -> None:
    raw = dict(model_type="gpt_oss", num_hidden_layers=24, num_local_experts=32, experts_per_token=4,
               num_experts_per_tok=4, vocab_size=201088, hidden_size=2880, intermediate_size=2880, head_dim=64,
               num_attention_heads=64, num_key_value_heads=8, sliding_window=128, swiglu_limit=7.0,
               rope_theta=150000, rope_scaling=dict(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0,
                                                    truncate=False, original_max_position_embeddings=4096),
               layer_types=["sliding_attention", "full_attention"] * 12, attention_bias=True,
               quantization_config=dict(quant_method="mxfp4", modules_to_not_convert=["model.layers.*.self_attn"]))
    cfg = read(write(tmp_path, raw))
    assert cfg.expert_dtype == "mxfp4" and cfg.num_experts == 32 and cfg.moe_intermediate_size == 2880
    assert cfg.rope_scaling is not None and not cfg.rope_scaling.truncate
    assert cfg.rope_scaling.original_max_position_embeddings == 4096


BASE = dict(vocab_size=10, hidden_size=8, intermediate_size=8, num_hidden_layers=2, num_attention_heads=2)


@pytest.mark.parametrize("raw, message", [
    (dict(BASE, model_type="gpt_oss", layer_types=["sliding_attention", "chunked_attention"]),
     r"layer_types\[1\]='chunked_attention': layer 1's attention kind is not supported; "
     r"allowed: full_attention, sliding_attention"),
    (dict(BASE, model_type="gpt_oss", layer_types=["full_attention"]), r"one kind per layer \(2\)"),
    (dict(BASE, model_type="qwen3_moe", mlp_only_layers=[0]), r"mlp_only_layers=\[0\].*allowed: mlp_only_layers \[\]"),
    (dict(BASE, model_type="gemma3_text", hidden_activation="relu"), r"hidden_activation='relu'.*gelu_pytorch_tanh"),
    (dict(BASE, model_type="gpt_oss", quantization_config=dict(quant_method="gptq")), r"'gptq'.*allowed: mxfp4"),
    (dict(BASE, model_type="qwen3", rope_scaling=dict(rope_type="yarn", factor=4.0)),
     r"rope type 'yarn' unsupported; allowed: default, llama3"),
    (dict(BASE, model_type="falcon"), r"'falcon'.*allowed: llama, mistral, qwen2, qwen3, qwen3_moe, gemma3"),
])
def test_unsupported_is_one_clear_error(raw: dict[str, Any], message: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=message):
        read(write(tmp_path, raw))


@pytest.mark.parametrize("override, key", [
    (dict(layer_types=["full_attention", "local"], num_layers=2), r"model\.layer_types\[1\]='local'.*allowed: "),
    (dict(layer_types=["sliding_attention"], num_layers=1), r"model\.sliding_window=None"),
    (dict(sliding_window=16), r"model\.sliding_window=16 needs sliding_attention"),
    (dict(num_experts=4, num_experts_per_tok=5, moe_intermediate_size=8), r"model\.num_experts_per_tok=5"),
    (dict(moe_intermediate_size=8), r"model\.num_experts > 0"),
    (dict(expert_dtype="int4", num_experts=2, num_experts_per_tok=1, moe_intermediate_size=8),
     r"model\.expert_dtype='int4'; allowed: dtype, mxfp4"),
    (dict(hidden_act="relu"), r"model\.hidden_act='relu'; allowed: silu, gelu_pytorch_tanh"),
    (dict(architecture="falcon"), r"model\.architecture='falcon'.*gpt_oss"),
])
def test_named_config_validation_names_the_key(override: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        resolve_model_config(ModelConfig(**override))
