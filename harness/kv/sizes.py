"""The sizing formulas every part of kvbench uses (one place, explicit).

Plain numbers only: config validation reads this module, and must not load torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.model.config import ModelConfig
from impls import sizing
from kernels.kv_formats import VALUE_BYTES, is_quantized, scale_bytes_per_head

if TYPE_CHECKING:
    import torch

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
GB = 1e9


def torch_dtype(dtype: str) -> torch.dtype:
    """The torch dtype of a config's ``dtype`` name (``float32``, ``float16``, ``bfloat16``)."""
    import torch  # here, not at the top: only a run that builds tensors asks

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]


def kv_bytes_per_token(model: ModelConfig, dtype: str, kv_dtype: str = "auto", kv_scale: str = "tensor") -> int:
    """K and V for one token across all layers (impls.sizing's formula on the model's shape).

    ``kv_dtype`` auto stores the model's ``dtype``; a quantized one stores a byte per element plus,
    at ``kv_scale=token_head``, an fp32 scale per token and kv head (kernels/kv_formats.py). The
    per-tensor scales (8 bytes a layer) are not per token and not counted here.
    """
    value_bytes = VALUE_BYTES if is_quantized(kv_dtype) else DTYPE_BYTES[dtype]
    return sizing.kv_bytes_per_token(model.num_layers, model.num_kv_heads, model.head_dim, value_bytes,
                                     scale_bytes_per_head(kv_dtype, kv_scale))


def parameter_count(model: ModelConfig) -> int:
    """Weights of a Llama-family model, from its shape (no tensors allocated)."""
    h, i = model.hidden_size, model.intermediate_size
    attn = h * model.q_size + 2 * h * model.kv_size + model.q_size * h
    if model.qkv_bias:
        attn += model.q_size + 2 * model.kv_size
        if model.architecture == "llama":  # HF Llama's attention_bias also biases o_proj
            attn += h
    mlp = 3 * h * i
    per_layer = attn + mlp + 2 * h  # two RMSNorm weights
    embed = model.vocab_size * h
    head = 0 if model.tie_word_embeddings else model.vocab_size * h
    return model.num_layers * per_layer + embed + head + h


def weight_bytes(model: ModelConfig, dtype: str) -> int:
    return parameter_count(model) * DTYPE_BYTES[dtype]


def activation_bytes_estimate(model: ModelConfig, dtype: str, max_tokens: int, logits_rows: int) -> int:
    """Peak activations of one forward over ``max_tokens`` tokens (no KV), for budgeting.

    Used where a profile run is impossible (CPU, capacity scenario): fp32 logits for
    ``logits_rows`` tokens (a prefill keeps only its last position, a decode step one
    per sequence) plus the widest intermediate (gate+up) and a few hidden-sized buffers.
    On a GPU the decode scenario measures the peak instead, as vLLM does.
    """
    b = DTYPE_BYTES[dtype]
    logits = logits_rows * model.vocab_size * 4
    mlp = max_tokens * 3 * model.intermediate_size * b
    hidden = max_tokens * 6 * max(model.hidden_size, model.q_size + 2 * model.kv_size) * b
    return logits + mlp + hidden
