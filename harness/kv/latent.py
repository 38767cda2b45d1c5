"""What a latent-attention (MLA) layer and a linear-attention layer keep, in plain numbers.

**Multi-head latent attention** (DeepSeek-V2/V3, Kimi-K2; transformers' ``DeepseekV3Attention``): a layer's
``kv_a_proj_with_mqa`` gives, per token, one latent of ``kv_lora_rank`` values (normed, then up-projected by
``kv_b_proj`` to every head's K-nope and V) and one rotary key of ``qk_rope_head_dim`` values that every head
shares. Every engine (vLLM, SGLang, FlashMLA, FlashInfer) caches those ``kv_lora_rank + qk_rope_head_dim``
values and never the per-head K and V: that is what kvbench caches too. The same model cached as ordinary
attention (the comparison figure) keeps ``num_heads x (qk_nope + qk_rope)`` K values and ``num_heads x
v_head_dim`` V values per token and layer (transformers' own DynamicCache does: it stores the expanded K/V).

**Linear attention** (Qwen3-Next's Gated DeltaNet, ``linear_attention`` layers; transformers'
``Qwen3NextGatedDeltaNet``): no per-token cache at all. A sequence keeps, per layer, a recurrent state of
``num_v_heads x key_head_dim x value_head_dim`` values and a convolution state of the last ``conv_kernel - 1``
inputs of its ``conv_dim = 2 x num_k_heads x key_head_dim + num_v_heads x value_head_dim`` channels, the same
size at 10 tokens and at 100,000. transformers keeps both in the model's dtype (the states take the value
tensors' dtype): so does kvbench (``dtype``).

Plain numbers only: config validation reads this module.
"""

from __future__ import annotations

from kvbench.harness.model.config import ModelConfig

LINEAR_ATTENTION = "linear_attention"
# FlashMLA's fp8 layout of one token in one layer (vLLM's ``fp8_ds_mla``): the latent in fp8 (one byte a value)
# with an fp32 scale per 128 values, and the rotary key left in bf16 (2 bytes a value): 656 bytes for
# DeepSeek-V3's 512 + 64. A comparison figure: kvbench's own fp8 store (kv_dtype=fp8_e4m3) keeps every value in
# one byte and one scale per tensor (or per token at kv_scale=token_head), kernels/kv_formats.py.
FLASHMLA_SCALE_GROUP = 128
FLASHMLA_SCALE_BYTES = 4
FLASHMLA_ROPE_BYTES = 2


def is_latent(model: ModelConfig) -> bool:
    """The model's attention caches a latent (MLA): ``kv_lora_rank`` is set."""
    return getattr(model, "kv_lora_rank", 0) > 0


def linear_layers(model: ModelConfig) -> int:
    """Layers of linear attention: they keep a fixed state per sequence, no K/V per token."""
    types = model.layer_types or ()
    return sum(1 for t in types if t == LINEAR_ATTENTION)


def cached_layers(model: ModelConfig) -> int:
    """Layers that keep something per token (K/V, or a latent): every layer but the linear ones."""
    return model.num_layers - linear_layers(model)


def latent_values_per_token(model: ModelConfig) -> int:
    """Values one token keeps in one MLA layer: its latent and its shared rotary key."""
    return model.kv_lora_rank + model.qk_rope_head_dim


def values_per_token(model: ModelConfig) -> int:
    """Values one token keeps in one caching layer: MLA's latent, else K and V of every kv head."""
    if is_latent(model):
        return latent_values_per_token(model)
    return 2 * model.num_kv_heads * model.head_dim


def scales_per_token(model: ModelConfig) -> int:
    """Quantization scales one token carries per layer at kv_scale=token_head: one per kv head for K and for V,
    one for MLA's latent (it has no heads: every head reads it)."""
    return 1 if is_latent(model) else 2 * model.num_kv_heads


def mha_values_per_token(model: ModelConfig) -> int:
    """The MLA model cached as ordinary attention, per token and layer: every head's K (nope and rotary parts)
    and V, as transformers' DynamicCache stores them."""
    heads = model.num_heads
    return heads * (model.qk_nope_head_dim + model.qk_rope_head_dim) + heads * model.v_head_dim


def flashmla_fp8_bytes_per_layer(model: ModelConfig) -> int:
    """FlashMLA's fp8 bytes of one token in one layer (656 for DeepSeek-V3), a comparison figure."""
    groups = -(-model.kv_lora_rank // FLASHMLA_SCALE_GROUP)
    return model.kv_lora_rank + groups * FLASHMLA_SCALE_BYTES + model.qk_rope_head_dim * FLASHMLA_ROPE_BYTES


def conv_channels(model: ModelConfig) -> int:
    """A Gated DeltaNet layer's convolution channels: q and k of every key head, v of every value head."""
    return (2 * model.linear_num_key_heads * model.linear_key_head_dim
            + model.linear_num_value_heads * model.linear_value_head_dim)


def recurrent_state_values(model: ModelConfig) -> int:
    """One sequence's recurrent state in one linear layer: a key_dim x value_dim matrix per value head."""
    return model.linear_num_value_heads * model.linear_key_head_dim * model.linear_value_head_dim


def conv_state_values(model: ModelConfig) -> int:
    """One sequence's convolution state in one linear layer: the last conv_kernel - 1 inputs of every channel."""
    return (model.linear_conv_kernel_dim - 1) * conv_channels(model)


def state_values_per_layer(model: ModelConfig) -> int:
    """One sequence's fixed state in one linear layer (recurrent and convolution), in values."""
    return recurrent_state_values(model) + conv_state_values(model)


def state_bytes_per_seq(model: ModelConfig, value_bytes: int) -> int:
    """One sequence's fixed state over every linear layer, at ``value_bytes`` a value (the model's dtype)."""
    return linear_layers(model) * state_values_per_layer(model) * value_bytes


def state_tokens(model: ModelConfig) -> int:
    """One linear layer's state in *token slots* of a caching layer (its K/V of one token), rounded up: what a
    state takes in a pool whose pages hold tokens (impls/attention_kinds.py ``LinearState``). The state and the
    K/V are both stored at the model's dtype, so the ratio is one of values (536 for Qwen3-Next-80B: a page of
    its 16-token blocks is 16 slots, so a state takes 34 pages, 544 slots; vLLM raises the attention block size
    to 544 tokens instead, so that one page holds one layer's state: the same padding)."""
    return -(-state_values_per_layer(model) // values_per_token(model))


def tp_note(model: ModelConfig, gpus: int) -> str | None:
    """How tensor parallelism over ``gpus`` GPUs splits this model's cache, for a row's notes (None: one GPU, or
    nothing to say). kvbench sizes a run as one device of the GPUs' summed memory: each sequence's cache is
    stored once, which is exact for K/V and state split by heads, and is data-parallel attention's figure for a
    latent (every rank holds its own sequences' latents)."""
    if gpus <= 1:
        return None
    if is_latent(model):
        return (f"MLA under tensor parallelism over {gpus} GPUs replicates the latent on every rank (it has no "
                f"heads to split): each sequence costs {gpus}x its latent and the pool holds 1/{gpus} of this row's "
                f"sequences; this row is data-parallel attention's figure (DP={gpus}: each rank caches its own "
                "sequences' latents, as vLLM and SGLang pair MLA with it)")
    if linear_layers(model):
        copies = max(1, gpus // model.num_kv_heads)
        kv = (f"K/V split by kv heads ({model.num_kv_heads} heads: each held by {copies} ranks, so the rows' K/V "
              f"bytes are {copies}x under TP={gpus})" if copies > 1 else "K/V split by kv heads")
        return (f"tensor parallelism over {gpus} GPUs: {kv}; the linear layers' state split by heads (stored once)")
    return None
