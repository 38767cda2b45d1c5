"""Weights of the latent-attention (DeepSeek-V2/V3, Kimi-K2) and linear-attention (Qwen3-Next) families, from
their shape, as transformers 5 holds them (``sum(p.numel() for p in model.parameters())``: DeepSeek-V3's
``e_score_correction_bias`` is a buffer, not counted; the multi-token-prediction layers are not part of the
model transformers builds, so neither are they here).

- DeepSeek (``DeepseekV2Attention`` / ``DeepseekV3Attention``): queries through a low-rank ``q_a_proj`` (with
  its norm) and ``q_b_proj``, or one ``q_proj`` when ``q_lora_rank`` is null (V2-Lite); ``kv_a_proj_with_mqa``
  to the latent and the rotary key, the latent's norm, ``kv_b_proj`` to every head's K-nope and V, ``o_proj``.
  The first ``first_k_dense_replace`` layers have a dense MLP of ``intermediate_size``; the others a router,
  ``num_experts`` routed experts and ``n_shared_experts`` shared ones of ``moe_intermediate_size``.
- Qwen3-Next: full-attention layers with a gated query (``q_proj`` twice as wide) and q/k norms; Gated DeltaNet
  layers (``in_proj_qkvz``, ``in_proj_ba``, a depthwise convolution, ``dt_bias``, ``A_log``, a gated norm,
  ``out_proj``); every layer's MLP a router, the routed experts and one gated shared expert.

Plain numbers only: config validation reads this module.
"""

from __future__ import annotations

from kvbench.harness.kv.latent import LINEAR_ATTENTION, conv_channels
from kvbench.harness.model.config import ModelConfig

LATENT_ARCHITECTURES = ("deepseek_v2", "deepseek_v3")
LINEAR_ARCHITECTURES = ("qwen3_next",)


def counts_here(model: ModelConfig) -> bool:
    """This module counts ``model``'s weights (harness/kv/sizes.py ``parameter_count`` asks)."""
    return model.architecture in LATENT_ARCHITECTURES + LINEAR_ARCHITECTURES


def mla_parameters(model: ModelConfig) -> int:
    """One DeepSeek attention layer's weights (biases where ``attention_bias``: q_a, kv_a and o)."""
    h, heads = model.hidden_size, model.num_heads
    qk = model.qk_nope_head_dim + model.qk_rope_head_dim
    bias = model.qkv_bias
    if model.q_lora_rank:
        q = h * model.q_lora_rank + model.q_lora_rank + model.q_lora_rank * heads * qk
        q += model.q_lora_rank if bias else 0
    else:
        q = h * heads * qk
    kv_a = h * (model.kv_lora_rank + model.qk_rope_head_dim) + model.kv_lora_rank
    kv_a += (model.kv_lora_rank + model.qk_rope_head_dim) if bias else 0
    kv_b = model.kv_lora_rank * heads * (model.qk_nope_head_dim + model.v_head_dim)
    o = heads * model.v_head_dim * h + (h if bias else 0)
    return q + kv_a + kv_b + o


def gated_attention_parameters(model: ModelConfig) -> int:
    """One Qwen3-Next full-attention layer: q (and its gate), k, v, o, and the q/k norms."""
    h, q, kv = model.hidden_size, model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim
    weights = h * 2 * q + 2 * h * kv + q * h + 2 * model.head_dim
    if model.qkv_bias:
        weights += 2 * q + 2 * kv + h
    return weights


def delta_net_parameters(model: ModelConfig) -> int:
    """One Gated DeltaNet layer: its projections in and out, the depthwise convolution, the decay's bias and
    log-rate per value head, and the gated norm over a value head."""
    h, nv = model.hidden_size, model.linear_num_value_heads
    key_dim = model.linear_num_key_heads * model.linear_key_head_dim
    value_dim = nv * model.linear_value_head_dim
    qkvz = h * (2 * key_dim + 2 * value_dim)
    ba = h * 2 * nv
    conv = conv_channels(model) * model.linear_conv_kernel_dim
    return qkvz + ba + conv + 2 * nv + model.linear_value_head_dim + value_dim * h


def moe_layer_parameters(model: ModelConfig) -> int:
    """One mixture layer: router, routed experts, shared experts (DeepSeek's n_shared_experts of
    moe_intermediate_size as one MLP; Qwen3-Next's one shared expert and its gate)."""
    h = model.hidden_size
    weights = h * model.num_experts + model.num_experts * 3 * h * model.moe_intermediate_size
    weights += 3 * h * model.moe_intermediate_size * model.n_shared_experts
    if model.shared_expert_intermediate_size:
        weights += 3 * h * model.shared_expert_intermediate_size + h
    return weights


def dense_layers(model: ModelConfig) -> int:
    """Layers with a dense MLP: DeepSeek's first ``first_k_dense_replace`` (all of them without experts)."""
    return model.num_layers if not model.num_experts else min(model.first_k_dense_replace, model.num_layers)


def layer_parameters(model: ModelConfig, layer: int) -> int:
    """Layer ``layer``'s weights: its attention (or linear attention), its MLP and its two norms."""
    h = model.hidden_size
    if model.architecture in LATENT_ARCHITECTURES:
        mixer = mla_parameters(model)
    elif (model.layer_types or [None] * model.num_layers)[layer] == LINEAR_ATTENTION:
        mixer = delta_net_parameters(model)
    else:
        mixer = gated_attention_parameters(model)
    mlp = 3 * h * model.intermediate_size if layer < dense_layers(model) else moe_layer_parameters(model)
    return mixer + mlp + 2 * h


def parameter_count(model: ModelConfig) -> int:
    """Every weight: the layers, the embedding, the LM head (once if tied) and the final norm."""
    h = model.hidden_size
    embed = model.vocab_size * h
    head = 0 if model.tie_word_embeddings else model.vocab_size * h
    return sum(layer_parameters(model, i) for i in range(model.num_layers)) + embed + head + h


def expert_matrix_parameters(model: ModelConfig) -> int:
    """Every routed expert's matrices over the model (the weights only a token's chosen experts read)."""
    moe_layers = model.num_layers - dense_layers(model)
    return moe_layers * model.num_experts * 3 * model.hidden_size * model.moe_intermediate_size
