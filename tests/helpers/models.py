"""Model-building helpers shared by the model and engine tests: tiny random HF models, the named configs."""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import OmegaConf

from kvbench.harness.model.config import ModelConfig
from tests.conftest import REPO_ROOT

MODEL_YAMLS = sorted(p for p in (REPO_ROOT / "conf" / "model").glob("*.yaml") if p.stem != "auto")

HF_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    # head_dim 32 != hidden/heads: the explicit head_dim key must be honoured.
    "llama-gqa": ("llama", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-5)),
    "llama3-rope-tied": (
        "llama",
        dict(
            num_attention_heads=4,
            num_key_value_heads=1,
            rope_theta=500000.0,
            # A short original context puts frequencies in all three llama3 bands.
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=64,
            ),
            tie_word_embeddings=True,
        ),
    ),
    "llama-attention-bias": ("llama", dict(num_attention_heads=4, num_key_value_heads=4, attention_bias=True)),
    "mistral": ("mistral", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16)),
    "qwen2-tied": ("qwen2", dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)),
    # Qwen3: per-head q/k norms (random, as every norm here), head_dim 32 != hidden/heads.
    "qwen3": ("qwen3", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6)),
    "qwen3-bias-tied": ("qwen3", dict(num_attention_heads=4, num_key_value_heads=4, head_dim=16,
                                      attention_bias=True, tie_word_embeddings=True)),
    # Qwen3-MoE: 6 experts of 24, 2 per token, renormalised (norm_topk_prob) or not.
    "qwen3-moe": ("qwen3_moe", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=6,
                                    num_experts_per_tok=2, moe_intermediate_size=24, norm_topk_prob=True)),
    "qwen3-moe-unnormed": ("qwen3_moe", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                             num_experts=5, num_experts_per_tok=3, moe_intermediate_size=16)),
}
# Families kvbench reads and sizes but does not compute (harness/model/support.py), and windows it computes
# only at short contexts: tiny random models for the reading and the parameter counts.
SIZE_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "gemma3-text": ("gemma3_text", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                        query_pre_attn_scalar=24, sliding_window=8, num_hidden_layers=7,
                                        rope_local_base_freq=2000.0, final_logit_softcapping=30.0)),
    "gpt-oss": ("gpt_oss", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_local_experts=6,
                                num_experts_per_tok=2, sliding_window=8, num_hidden_layers=4)),
    "mistral-window": ("mistral", dict(num_attention_heads=4, num_key_value_heads=2, sliding_window=8)),
    "qwen2-window": ("qwen2", dict(num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True,
                                   sliding_window=8, max_window_layers=1)),
}
# Sliding windows computed token for token (kernels/reference.py's window): a 24-token window under prompts and
# generations longer than it; Qwen2/3 slide from max_window_layers on, so their layer 0 attends to everything.
WINDOW_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    # head_dim 64: the smallest the Triton and CUDA kernels take (kernels/validate.py).
    "mistral-sliding": ("mistral", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=64, sliding_window=24)),
    "qwen2-sliding": ("qwen2", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=64, use_sliding_window=True,
                                    sliding_window=24, max_window_layers=1)),
    "qwen3-sliding": ("qwen3", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_hidden_layers=3,
                                    use_sliding_window=True, sliding_window=24, max_window_layers=1)),
}
# gpt-oss token for token (harness/model/gpt_oss.py): sinks on every layer, a 24-token window on every other one
# (layer 0 slides), yarn RoPE (transformers' defaults: factor 32), 3 of 8 experts a token, and a swiglu_limit low
# enough that the clamps bite (at gpt-oss's 7.0 these unit-scale weights never reach it).
GPT_OSS_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "gpt-oss-sliding": ("gpt_oss", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_hidden_layers=4,
                                        sliding_window=24, num_local_experts=8, num_experts_per_tok=3,
                                        swiglu_limit=1.2)),
}
# Gemma 3 token for token (harness/model/gemma3.py): 7 layers, so both kinds appear (five sliding, a full one, a
# sliding one), a 24-token window, a softmax scale of query_pre_attn_scalar=48 (not head_dim=64), its own RoPE base
# on the sliding layers, linear RoPE scaling on the full one, and soft-capped logits.
GEMMA3_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "gemma3-sliding": ("gemma3_text", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                           num_hidden_layers=7, sliding_window=24, query_pre_attn_scalar=48,
                                           rope_local_base_freq=2000.0, final_logit_softcapping=30.0,
                                           rope_scaling=dict(rope_type="linear", factor=4.0))),
}
# Qwen3-Next token for token (harness/model/qwen3_next.py): three Gated DeltaNet layers and a gated full-attention one
# (full_attention_interval 4), head_dim 64 for the kernels, RoPE on a quarter of it, value heads twice the key heads
# with a value size (24) that is not the key size (16), and 2 of 6 experts a token beside the gated shared expert.
QWEN3_NEXT_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3-next": ("qwen3_next", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_hidden_layers=4,
                                      linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                                      linear_value_head_dim=24, linear_conv_kernel_dim=4, num_experts=6,
                                      num_experts_per_tok=2, moe_intermediate_size=24,
                                      shared_expert_intermediate_size=32, norm_topk_prob=True)),
}
# DeepSeek token for token (harness/model/deepseek.py): MLA with a latent of 64 and a rotary key of 16 (the cache's one
# kv head of 80 values), K 32 + 16 and V 24 per head; V3 with a q latent, interleaved rotary pairs, yarn with both
# mscale keys, 2 of 8 experts in 4 groups (2 groups kept) plus a shared expert after one dense layer; V2-Lite-like
# with one q_proj, 2 heads, softmax greedy routing over 6 experts and 2 shared ones.
DEEPSEEK_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "deepseek-v3": ("deepseek_v3", dict(num_attention_heads=4, num_hidden_layers=3, q_lora_rank=48, kv_lora_rank=64,
                                        qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=24, n_routed_experts=8,
                                        num_experts_per_tok=2, n_group=4, topk_group=2, n_shared_experts=1,
                                        moe_intermediate_size=24, first_k_dense_replace=1, routed_scaling_factor=2.5,
                                        norm_topk_prob=True, rope_interleave=True,
                                        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                                             original_max_position_embeddings=128, mscale=0.9,
                                                             mscale_all_dim=0.8))),
    "deepseek-v2-lite": ("deepseek_v2", dict(num_attention_heads=2, num_hidden_layers=2, q_lora_rank=None,
                                             kv_lora_rank=64, qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=24,
                                             n_routed_experts=6, num_experts_per_tok=2, n_shared_experts=2,
                                             moe_intermediate_size=24, first_k_dense_replace=1, topk_method="greedy",
                                             rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                                                  original_max_position_embeddings=128, mscale=0.707,
                                                                  mscale_all_dim=0.707))),
}
HF_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM"),
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM"),
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM"),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM"),
}


def make_hf_model(case: str, seed: int = 0) -> Any:
    """A tiny random HF model whose weights are all O(1) (HF's own 0.02 init would make
    every logit ~0 and the comparison vacuous); norms random too, to catch swaps."""
    import transformers

    arch, extra = {**HF_CASES, **SIZE_CASES, **WINDOW_CASES, **GPT_OSS_CASES, **GEMMA3_CASES,
                    **QWEN3_NEXT_CASES, **DEEPSEEK_CASES}[case]
    config_cls, model_cls = (getattr(transformers, n) for n in HF_CLASSES[arch])
    shape = dict(
        vocab_size=160,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        max_position_embeddings=512,
    )
    config = config_cls(**{**shape, **extra})
    torch.manual_seed(seed)
    model = model_cls(config).float().eval()
    # Gemma stores a norm's weight as an offset from 1, and scales its embeddings by sqrt(hidden): drawn that much
    # smaller (x2), or the token's own embedding outweighs every layer and hides attention from the greedy tokens.
    gemma = arch == "gemma3_text"
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                # Qwen3-Next's norms scale by 1 + w too, but for its DeltaNet's gated norm (a plain weight)
                centred = gemma or (arch == "qwen3_next" and not name.endswith("linear_attn.norm.weight"))
                p.copy_((0.0 if centred else 1.0) + 0.3 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.3)
            elif "embed_tokens" in name:
                p.normal_(0.0, 2 * config.hidden_size**-0.5 if gemma else 1.0)
            elif p.dim() == 1:  # gpt-oss's sinks and router bias
                p.normal_(0.0, 0.3)
            else:
                p.normal_(0.0, p.shape[1] ** -0.5)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # DeepSeek-V3's router bias (a buffer: zeros otherwise)
                b.normal_(0.0, 0.3)
    return model


def load_named(name: str) -> ModelConfig:
    merged = OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load(REPO_ROOT / "conf" / "model" / f"{name}.yaml"))
    return OmegaConf.to_object(merged)


WORDS = [f"w{i}" for i in range(150)]  # a word-level vocabulary that fits make_hf_model's 160 ids


def write_hf_checkpoint(folder, case: str = "llama-gqa", seed: int = 0):
    """A tiny random HF checkpoint (config.json + safetensors) with a word-level ``tokenizer.json``,
    as a user's ``model.path`` folder; returns the folder."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    make_hf_model(case, seed).save_pretrained(folder)
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.save(str(folder / "tokenizer.json"))
    return folder


def write_text(path, words: int, seed: int = 0):
    """A text of ``words`` words of the checkpoint's vocabulary, with some repetition (a bigram habit),
    so a model has something to be right about; returns the path."""
    import random

    rng = random.Random(seed)
    out, prev = [], rng.choice(WORDS)
    for _ in range(words):
        prev = WORDS[(WORDS.index(prev) + 1) % len(WORDS)] if rng.random() < 0.5 else rng.choice(WORDS)
        out.append(prev)
    path.write_text(" ".join(out) + "\n")
    return path
