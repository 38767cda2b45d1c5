"""The sizing formulas every part of kvbench uses (one place, explicit).

Plain numbers only: config validation reads this module, and must not load torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvbench.harness.errors import ConfigError
from kvbench.harness.kv import latent, latent_params
from kvbench.harness.model.config import ModelConfig
from kvbench.kernels.kv_formats import VALUE_BYTES, is_quantized, scale_bytes_per_head

if TYPE_CHECKING:
    import torch

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
# The dtypes weights may be stored (and priced) at, ``weight_dtype``: fp8 is one byte a value (E4M3, a scale per
# tensor or channel, not counted), as vLLM serves an fp8 checkpoint.
WEIGHT_DTYPE_BYTES = {**DTYPE_BYTES, "fp8": 1}
GB = 1e9
MIB = 2**20


def torch_dtype(dtype: str) -> torch.dtype:
    """The torch dtype of a config's ``dtype`` name (``float32``, ``float16``, ``bfloat16``)."""
    import torch  # here, not at the top: only a run that builds tensors asks

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]


def kv_bytes_per_token(model: ModelConfig, dtype: str, kv_dtype: str = "auto", kv_scale: str = "tensor") -> int:
    """What one token keeps across all layers: K and V of every kv head (impls.sizing's formula), or an MLA
    layer's latent and rotary key (harness/kv/latent.py); a linear-attention layer keeps no token (its fixed state
    is ``state_bytes_per_seq``).

    ``kv_dtype`` auto stores the model's ``dtype``; a quantized one stores a byte per element plus,
    at ``kv_scale=token_head``, an fp32 scale per token and kv head (one per token for MLA's latent, which has
    no heads; kernels/kv_formats.py). The per-tensor scales (8 bytes a layer) are not per token and not counted
    here. A quantized store beside a recurrent state is refused: the state stays at ``dtype`` and the pool counts
    it in token slots of the store's format (harness/kv/latent.py ``state_tokens``).
    """
    if is_quantized(kv_dtype) and latent.linear_layers(model):
        raise ConfigError(f"kv_dtype={kv_dtype} on model={model.name} (linear_attention layers): a quantized K/V store "
                          f"beside a state kept at dtype={dtype} is not modelled; allowed: kv_dtype=auto")
    value_bytes = VALUE_BYTES if is_quantized(kv_dtype) else DTYPE_BYTES[dtype]
    per_layer = (latent.values_per_token(model) * value_bytes
                 + latent.scales_per_token(model) * scale_bytes_per_head(kv_dtype, kv_scale))
    return latent.cached_layers(model) * per_layer


def state_bytes_per_seq(model: ModelConfig, dtype: str) -> int:
    """One sequence's fixed state over every linear-attention layer, at ``dtype`` (0 for a model without one)."""
    return latent.state_bytes_per_seq(model, DTYPE_BYTES[dtype])


def mha_bytes_per_token(model: ModelConfig, dtype: str) -> int | None:
    """An MLA model cached as ordinary attention (every head's K and V), per token over its layers, at ``dtype``:
    the comparison figure beside ``kv_bytes_per_token`` (None: not an MLA model)."""
    if not latent.is_latent(model):
        return None
    return model.num_layers * latent.mha_values_per_token(model) * DTYPE_BYTES[dtype]


def parameter_count(model: ModelConfig) -> int:
    """Weights of the model, from its shape (no tensors allocated): every expert of a mixture counted, a tied
    lm_head once. Each family's extra tensors as transformers holds them: q/k norms (Qwen3, Gemma 3),
    Gemma 3's sandwich norms, gpt-oss's sinks, router bias and expert biases. DeepSeek (MLA) and Qwen3-Next (linear
    attention): harness/kv/latent_params.py."""
    if latent_params.counts_here(model):
        return latent_params.parameter_count(model)
    h = model.hidden_size
    attn = h * model.q_size + 2 * h * model.kv_size + model.q_size * h
    if model.qkv_bias:
        attn += model.q_size + 2 * model.kv_size
        if model.o_bias:
            attn += h
    if model.qk_norm:
        attn += 2 * model.head_dim
    if model.attention_sinks:
        attn += model.num_heads
    norms = (4 if model.architecture == "gemma3_text" else 2) * h  # Gemma 3 norms before and after each half
    per_layer = attn + dense_mlp_parameters(model) + expert_parameters(model) + norms
    embed = model.vocab_size * h
    head = 0 if model.tie_word_embeddings else model.vocab_size * h
    return model.num_layers * per_layer + embed + head + h


def dense_mlp_parameters(model: ModelConfig) -> int:
    """A layer's gated MLP, or its mixture's router (gpt-oss's with a bias): what is not an expert matrix."""
    if model.is_moe:
        return model.hidden_size * model.num_experts + (model.num_experts if model.architecture == "gpt_oss" else 0)
    return 3 * model.hidden_size * model.intermediate_size


def expert_parameters(model: ModelConfig) -> int:
    """A layer's routed experts: gate, up and down matrices (all experts), plus gpt-oss's per-expert biases."""
    if not model.is_moe:
        return 0
    return expert_matrix_parameters(model) + expert_bias_parameters(model)


def expert_matrix_parameters(model: ModelConfig) -> int:
    """A layer's expert weight matrices: the tensors an MXFP4 checkpoint stores at 4 bits (DeepSeek's dense first
    layers have none: a mean over its layers, harness/kv/latent_params.py)."""
    if latent_params.counts_here(model):
        return latent_params.expert_matrix_parameters(model) // model.num_layers
    return model.num_experts * 3 * model.hidden_size * model.moe_intermediate_size


def expert_bias_parameters(model: ModelConfig) -> int:
    if model.architecture != "gpt_oss":
        return 0
    return model.num_experts * (2 * model.moe_intermediate_size + model.hidden_size)


# MXFP4 (OCP microscaling): a 4-bit E2M1 value per weight and one 8-bit E8M0 scale per block of 32.
MXFP4_BLOCK = 32


def weight_bytes(model: ModelConfig, dtype: str) -> int:
    """Bytes of the weights as stored: every tensor at ``dtype`` (``WEIGHT_DTYPE_BYTES``: fp8 too), except experts
    a checkpoint ships in MXFP4 (``expert_dtype: mxfp4``, gpt-oss), which take half a byte a value plus a byte per
    32 (biases stay at ``dtype``)."""
    params = parameter_count(model)
    if model.expert_dtype != "mxfp4":
        return params * WEIGHT_DTYPE_BYTES[dtype]
    packed = model.num_layers * expert_matrix_parameters(model)
    mxfp4 = packed // 2 + -(-packed // MXFP4_BLOCK)
    return (params - packed) * WEIGHT_DTYPE_BYTES[dtype] + mxfp4


def embedding_parameters(model: ModelConfig) -> int:
    """The token embedding table (vocab x hidden): a lookup, read a row a token; a tied LM head is this matrix."""
    return model.vocab_size * model.hidden_size


def stored_weight_bytes(model: ModelConfig, dtype: str, weight_dtype: str = "auto") -> int:
    """Bytes of the weights stored at ``weight_dtype`` (auto: ``dtype``): the decoder layers at it, the embedding
    table and LM head at ``dtype`` (an fp8 checkpoint keeps them so: llm-compressor's FP8 schemes ignore lm_head, and
    the embedding is no Linear). Norms and biases (under 0.01% of the parameters) are counted at ``weight_dtype``."""
    stored = dtype if weight_dtype == "auto" else weight_dtype
    tables = embedding_parameters(model) * (1 if model.tie_word_embeddings else 2)
    return weight_bytes(model, stored) + tables * (DTYPE_BYTES[dtype] - WEIGHT_DTYPE_BYTES[stored])


def activation_bytes_estimate(model: ModelConfig, dtype: str, max_tokens: int, logits_rows: int) -> int:
    """Peak activations of one forward over ``max_tokens`` tokens (no KV), for budgeting.

    Used where a profile run is impossible (CPU, capacity scenario): fp32 logits for
    ``logits_rows`` tokens (a prefill keeps only its last position, a decode step one
    per sequence) plus the widest intermediate (gate+up) and a few hidden-sized buffers.
    On a GPU the decode scenario measures the peak instead, as vLLM does.
    """
    b = DTYPE_BYTES[dtype]
    logits = logits_rows * model.vocab_size * 4
    # A mixture's widest intermediate: each token's chosen experts' gate+up, and the router's logits.
    width = (model.num_experts_per_tok * model.moe_intermediate_size + model.num_experts if model.is_moe
             else model.intermediate_size)
    mlp = max_tokens * 3 * width * b
    hidden = max_tokens * 6 * max(model.hidden_size, model.q_size + 2 * model.kv_size) * b
    return logits + mlp + hidden
