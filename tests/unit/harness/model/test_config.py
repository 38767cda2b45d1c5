"""Every named model config in conf/model/: valid, and its published shape."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvbench.harness.kv.sizes import parameter_count
from kvbench.harness.model.hf_config import resolve_model_config
from kvbench.harness.model.llama import LlamaModel
from tests.helpers.models import MODEL_YAMLS, load_named

# ---------------------------------------------------------------- named configs

PUBLISHED_PARAMETERS = {
    "llama-2-7b": 6_738_415_616,
    "llama-2-13b": 13_015_864_320,
    "llama-3-8b": 8_030_261_248,
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.1-70b": 70_553_706_496,
    "llama-3.1-405b": 405_853_388_800,  # the model card's safetensors total
    "llama-3.2-1b": 1_235_814_400,
    "mistral-7b": 7_241_732_096,
    "qwen2.5-0.5b": 494_032_768,
    "qwen2.5-7b": 7_615_616_512,
    "qwen2.5-72b": 72_706_203_648,  # the model card: 72.7B
}


# The other families' published totals (model cards), which kvbench sizes but does not build: its own count
# (harness/kv/sizes.py) within 1% (the cards round to 3 figures; Gemma's counts the vision tower too).
PUBLISHED_TOTALS = {
    "qwen3-32b": 32.8e9,
    "qwen3-30b-a3b": 30.5e9,
    "gemma-3-27b": 27.0e9,  # the language model alone (the vision tower is not modelled)
    "gpt-oss-20b": 20.9e9,
    "gpt-oss-120b": 116.8e9,
    # MLA and linear attention (harness/kv/latent_params.py; DeepSeek-V3 without its multi-token-prediction layer)
    "deepseek-v3": 671e9,
    "kimi-k2": 1.03e12,
    "deepseek-v2-lite": 15.7e9,
    "qwen3-next-80b-a3b": 79.7e9,
}


@pytest.mark.parametrize("path", MODEL_YAMLS, ids=[p.stem for p in MODEL_YAMLS])
def test_named_config_loads_and_validates(path: Path) -> None:
    cfg = resolve_model_config(load_named(path.stem))
    assert cfg.name == path.stem and cfg.weights == "dummy" and cfg.path is None
    assert cfg.head_dim in (64, 80, 96, 128, 256)  # what the attention kernels support
    if path.stem in PUBLISHED_PARAMETERS:
        # Meta device: the real module tree, no memory; checks every shape field at once.
        model = LlamaModel(cfg, torch.float16, "meta")
        assert model.num_parameter_bytes() == 2 * PUBLISHED_PARAMETERS[path.stem]


def test_named_config_spot_checks() -> None:
    assert set(PUBLISHED_PARAMETERS) | set(PUBLISHED_TOTALS) | {
        "tiny-llama", "tiny-qwen2", "tiny-mistral", "tiny-qwen3", "tiny-gemma3", "tiny-gpt-oss", "llama-58m"} == {
        p.stem for p in MODEL_YAMLS}
    # issue 23's second CPU shape: hidden 512, 8 layers, 8/4 heads, vocab 32000, 58M parameters
    m58 = resolve_model_config(load_named("llama-58m"))
    assert LlamaModel(m58, torch.float32, "meta").num_parameter_bytes() == 4 * 57_942_528
    l2 = load_named("llama-2-7b")
    assert 2 * l2.num_layers * l2.num_kv_heads * l2.head_dim * 2 == 524288
    l70 = load_named("llama-3.1-70b")
    assert (l70.num_layers, l70.num_kv_heads, l70.hidden_size) == (80, 8, 8192)
    l31 = load_named("llama-3.1-8b")
    assert l31.rope_scaling is not None and (l31.rope_scaling.factor, l31.rope_theta) == (8.0, 500000.0)
    assert load_named("llama-3.2-1b").rope_scaling.factor == 32.0  # type: ignore[union-attr]
    q = load_named("qwen2.5-0.5b")
    assert q.qkv_bias and q.tie_word_embeddings and q.rms_norm_eps == 1e-6
    tiny = load_named("tiny-llama")
    assert (
        tiny.vocab_size, tiny.hidden_size, tiny.num_heads, tiny.num_kv_heads,
        tiny.head_dim, tiny.num_layers, tiny.intermediate_size, tiny.rope_theta, tiny.tie_word_embeddings,
    ) == (4096, 256, 4, 2, 64, 4, 768, 10000.0, False)  # fmt: skip
    tq = load_named("tiny-qwen2")
    assert tq.architecture == "qwen2" and tq.qkv_bias and tq.tie_word_embeddings and tq.hidden_size == 256


@pytest.mark.parametrize("name", sorted(PUBLISHED_TOTALS))
def test_other_families_published_totals(name: str) -> None:
    cfg = resolve_model_config(load_named(name))
    assert parameter_count(cfg) == pytest.approx(PUBLISHED_TOTALS[name], rel=0.01)


def test_other_families_spot_checks() -> None:
    q3 = load_named("qwen3-30b-a3b")
    assert (q3.num_experts, q3.num_experts_per_tok, q3.moe_intermediate_size, q3.norm_topk_prob, q3.qk_norm) == (
        128, 8, 768, True, True)
    g = load_named("gemma-3-27b")
    assert g.layer_types is not None and len(g.layer_types) == 62 and g.sliding_window == 1024
    assert [i for i, k in enumerate(g.layer_types) if k == "full_attention"] == list(range(5, 62, 6))
    assert (g.query_pre_attn_scalar, g.rope_local_theta, g.rope_scaling.rope_type) == (168.0, 10000.0, "linear")
    for name, layers, experts in (("gpt-oss-20b", 24, 32), ("gpt-oss-120b", 36, 128)):
        o = load_named(name)
        assert o.layer_types == ["sliding_attention", "full_attention"] * (layers // 2)
        assert (o.num_experts, o.sliding_window, o.attention_sinks, o.expert_dtype) == (experts, 128, True, "mxfp4")
    m = load_named("mistral-7b")
    assert m.layer_types == ["sliding_attention"] * 32 and m.sliding_window == 4096
