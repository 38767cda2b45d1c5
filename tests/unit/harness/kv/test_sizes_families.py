"""harness/kv/sizes.py's weights for every model family: transformers' own count of tiny random models, the built
decoder's, and gpt-oss's MXFP4 experts priced at their stored size."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvbench.harness.kv.sizes import activation_bytes_estimate, parameter_count, weight_bytes
from kvbench.harness.model.config import ModelConfig
from kvbench.harness.model.hf_config import resolve_model_config
from kvbench.harness.model.llama import LlamaModel
from tests.helpers.models import HF_CASES, SIZE_CASES, load_named, make_hf_model

pytest.importorskip("transformers")


def _read(case: str, folder: Path) -> tuple[torch.nn.Module, ModelConfig]:
    hf = make_hf_model(case)
    hf.config.save_pretrained(folder)  # the shape alone: sizes need no weights
    return hf, resolve_model_config(ModelConfig(path=str(folder)))


@pytest.mark.parametrize("case", [*HF_CASES, *SIZE_CASES])
def test_parameter_count_is_transformers_count(case: str, tmp_path: Path) -> None:
    """sum(p.numel()) of the HF model (a tied lm_head is one parameter): every expert, norm, bias and sink."""
    hf, cfg = _read(case, tmp_path)
    assert parameter_count(cfg) == sum(p.numel() for p in hf.parameters())


@pytest.mark.parametrize("name", ["tiny-qwen3", "qwen3-32b", "tiny-qwen2", "llama-3.1-8b"])
def test_parameter_count_is_the_built_decoders(name: str) -> None:
    cfg = resolve_model_config(load_named(name))
    assert LlamaModel(cfg, torch.float16, "meta").num_parameter_bytes() == 2 * parameter_count(cfg)


def test_mxfp4_experts_take_half_a_byte_and_a_scale_per_32(tmp_path: Path) -> None:
    hf, cfg = _read("gpt-oss", tmp_path)
    experts = sum(p.numel() for n, p in hf.named_parameters() if n.endswith(("gate_up_proj", "down_proj")))
    rest = sum(p.numel() for p in hf.parameters()) - experts
    assert experts % 32 == 0 and weight_bytes(cfg, "bfloat16") == 2 * (rest + experts)  # no quantization_config
    cfg.expert_dtype = "mxfp4"
    assert weight_bytes(cfg, "bfloat16") == 2 * rest + experts // 2 + experts // 32
    assert weight_bytes(cfg, "float32") == 4 * rest + experts // 2 + experts // 32


# gpt-oss model card (arXiv 2508.10925, table 1): checkpoint sizes with MXFP4 experts, bf16 elsewhere.
GPT_OSS_CHECKPOINT_GIB = {"gpt-oss-20b": 12.8, "gpt-oss-120b": 60.8}


@pytest.mark.parametrize("name", sorted(GPT_OSS_CHECKPOINT_GIB))
def test_gpt_oss_weight_bytes_are_its_checkpoint(name: str) -> None:
    cfg = resolve_model_config(load_named(name))
    assert weight_bytes(cfg, "bfloat16") / 2**30 == pytest.approx(GPT_OSS_CHECKPOINT_GIB[name], rel=0.01)


def test_moe_activations_are_the_chosen_experts_not_the_dense_size() -> None:
    moe = resolve_model_config(load_named("qwen3-30b-a3b"))
    dense = resolve_model_config(load_named("qwen3-32b"))
    per_token = activation_bytes_estimate(moe, "bfloat16", 1000, 0) / 1000
    # gate+up of 8 experts of 768 and the router's 128 logits, three buffers' worth, plus the hidden rows
    assert per_token == 2 * (3 * (8 * 768 + 128) + 6 * (32 + 2 * 4) * 128)
    assert activation_bytes_estimate(dense, "bfloat16", 1000, 0) > 1000 * 2 * 3 * 25600


def _hf_config(cfg: ModelConfig) -> object:
    """transformers' config of a named kvbench config's shape."""
    import transformers

    from tests.helpers.models import HF_CLASSES

    shape = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                 num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
                 num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                 tie_word_embeddings=cfg.tie_word_embeddings)
    if cfg.architecture != "gemma3_text":
        shape["attention_bias"] = cfg.qkv_bias
    if cfg.is_moe:
        shape.update(num_experts=cfg.num_experts, num_experts_per_tok=cfg.num_experts_per_tok)
        if cfg.architecture == "qwen3_moe":
            shape["moe_intermediate_size"] = cfg.moe_intermediate_size
    return getattr(transformers, HF_CLASSES[cfg.architecture][0])(**shape)


@pytest.mark.parametrize("name", ["qwen3-32b", "qwen3-30b-a3b", "gemma-3-27b", "gpt-oss-20b", "gpt-oss-120b"])
def test_real_sizes_are_transformers_count(name: str) -> None:
    """The real-size models built by transformers on the meta device (no memory): the same count, to the parameter."""
    import transformers

    from tests.helpers.models import HF_CLASSES

    cfg = resolve_model_config(load_named(name))
    with torch.device("meta"):
        hf = getattr(transformers, HF_CLASSES[cfg.architecture][1])(_hf_config(cfg))
    assert parameter_count(cfg) == sum(p.numel() for p in hf.parameters())
