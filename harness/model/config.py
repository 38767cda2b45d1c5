"""The model config group's schema: a decoder's shape, by name or from a HF folder.

Fields mirror Hugging Face ``config.json`` so a named YAML in conf/model/ and a
local checkpoint folder produce the same object.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional

ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "gemma3_text", "gpt_oss", "deepseek_v2",
                 "deepseek_v3", "qwen3_next")
# The architectures harness/model/llama.py (or a family's own module, harness/model/families.py) computes token for
# token; the others (and any model whose layers include sliding windows shorter than the run's context) load for
# capacity and simulated serving only.
COMPUTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "gpt_oss", "gemma3_text", "qwen3_next",
                         "deepseek_v2", "deepseek_v3")
WEIGHT_SOURCES = ("dummy", "path")
LAYER_TYPES = ("full_attention", "sliding_attention", "linear_attention")
ROPE_TYPES = ("llama3", "linear", "yarn")
HIDDEN_ACTS = ("silu", "gelu_pytorch_tanh")
# How the routed experts' weights are stored: "dtype" the run's dtype; "mxfp4" 4-bit values with one 8-bit
# scale per 32 (gpt-oss's published checkpoints).
EXPERT_DTYPES = ("dtype", "mxfp4")


@dataclass
class RopeScaling:
    """RoPE frequency scaling: Llama-3.1's ``llama3`` (harness/model/rope.py), ``linear`` (Gemma 3's global
    layers) and ``yarn`` (gpt-oss; harness/model/rope_yarn.py)."""

    rope_type: str = "llama3"
    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    # yarn's ramp between the fast and slow rotations, and whether its bounds are truncated to integers.
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    # DeepSeek's yarn: cos/sin scaled by mscale(mscale) / mscale(mscale_all_dim), the softmax scale by
    # mscale(mscale_all_dim) squared (transformers' yarn_get_mscale, yarn_apply_mscale); 0: unset.
    mscale: float = 0.0
    mscale_all_dim: float = 0.0


@dataclass
class ModelConfig:
    name: str = "tiny-llama"
    architecture: str = "llama"
    # Defaults are tiny-llama's shape (conf/model/tiny-llama.yaml).
    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 768
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    rope_theta: float = 10000.0
    rope_scaling: Optional[RopeScaling] = None
    rms_norm_eps: float = 1e-5
    qkv_bias: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096
    # Per layer, its attention kind in transformers' names ("full_attention", "sliding_attention"); None: every
    # layer attends to every earlier token. The KV cache groups layers of one kind (harness/kv/groups.py).
    layer_types: Optional[List[str]] = None
    # The window of a "sliding_attention" layer, in tokens (a query sees itself and the window - 1 before it).
    sliding_window: Optional[int] = None
    # gpt-oss: a learned per-head logit that joins every softmax and caches nothing.
    attention_sinks: bool = False
    # Qwen3, Gemma 3: an RMSNorm over head_dim of every q and k head, before RoPE.
    qk_norm: bool = False
    # The MLP's activation: silu (SwiGLU) or Gemma's gelu_pytorch_tanh (GeGLU).
    hidden_act: str = "silu"
    # Mixture of experts (Qwen3-MoE, gpt-oss): every layer's MLP is num_experts experts of moe_intermediate_size,
    # num_experts_per_tok of them per token; 0 experts: a dense MLP of intermediate_size.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    # Whether the chosen experts' router weights are renormalised to sum to 1 (gpt-oss's softmax over its
    # top-k logits is that renormalisation).
    norm_topk_prob: bool = False
    expert_dtype: str = "dtype"
    # gpt-oss's clamped SwiGLU: gate clamped above, up to [-limit, limit]; null: plain SwiGLU.
    swiglu_limit: Optional[float] = None
    # Gemma 3: the softmax scale is query_pre_attn_scalar ** -0.5 (null: head_dim ** -0.5); sliding layers'
    # RoPE base (null: rope_theta for every layer); tanh soft caps of the attention scores and the logits.
    query_pre_attn_scalar: Optional[float] = None
    rope_local_theta: Optional[float] = None
    attn_logit_softcapping: Optional[float] = None
    final_logit_softcapping: Optional[float] = None
    # Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2; harness/kv/latent.py): kv_lora_rank > 0 caches, per
    # token and layer, a latent of kv_lora_rank values and a rotary key of qk_rope_head_dim shared by every head
    # (head_dim is qk_rope_head_dim, as transformers sets it); a head's K is qk_nope + qk_rope, its V v_head_dim;
    # q_lora_rank null: the queries in one projection (V2-Lite). 0: ordinary attention.
    kv_lora_rank: int = 0
    q_lora_rank: Optional[int] = None
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # DeepSeek's mixture: the first first_k_dense_replace layers have a dense MLP of intermediate_size, the others
    # the routed experts plus n_shared_experts always-on experts of moe_intermediate_size.
    first_k_dense_replace: int = 0
    n_shared_experts: int = 0
    # DeepSeek's router (harness/model/deepseek_moe.py): the experts in n_group groups, only the topk_group best
    # groups' experts chosen (V3 always; V2 under topk_method group_limited_greedy), the weights times
    # routed_scaling_factor. rope_interleave: V3's rotary part in interleaved pairs (V2's always is).
    n_group: int = 1
    topk_group: int = 1
    topk_method: str = "greedy"
    routed_scaling_factor: float = 1.0
    rope_interleave: bool = True
    # Qwen3-Next: one gated shared expert of this size beside the routed ones (0: none).
    shared_expert_intermediate_size: int = 0
    # Qwen3-Next's Gated DeltaNet ("linear_attention" layers): key and value heads and sizes, and the width of its
    # short convolution. A sequence keeps a fixed state per such layer (harness/kv/latent.py), no K/V per token.
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    # Qwen3-Next: RoPE rotates the first head_dim * partial_rotary_factor dims of each q and k head (1.0: all).
    partial_rotary_factor: float = 1.0
    # "dummy": seeded random weights; "path": safetensors from ``path``.
    weights: str = "dummy"
    # Local Hugging Face folder (config.json + *.safetensors). Setting it
    # replaces the shape above with the folder's config.json.
    path: Optional[str] = None

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def softmax_scale(self) -> float:
        return softmax_scale(self)

    @property
    def o_bias(self) -> bool:
        """attention_bias biases o_proj too, except in Qwen2 (q/k/v only; Mistral never reads it)."""
        return self.qkv_bias and self.architecture != "qwen2"

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0


def softmax_scale(model: ModelConfig) -> float:
    """The attention scores' scale, which the KV cache applies: ``query_pre_attn_scalar ** -0.5`` (Gemma 3), else
    ``head_dim ** -0.5``; MLA's (DeepSeek): ``(qk_nope_head_dim + qk_rope_head_dim) ** -0.5``, times yarn's
    mscale(mscale_all_dim) squared where set. A function too, for a config still in its OmegaConf form (no
    properties there)."""
    if getattr(model, "kv_lora_rank", 0) > 0:
        scaling = model.rope_scaling
        scale = (model.qk_nope_head_dim + model.qk_rope_head_dim) ** -0.5
        if scaling is not None and scaling.rope_type != "default" and scaling.mscale_all_dim:
            scale *= yarn_mscale(scaling.factor, scaling.mscale_all_dim) ** 2
        return scale
    scalar = model.head_dim if model.query_pre_attn_scalar is None else model.query_pre_attn_scalar
    return scalar**-0.5


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """transformers' ``yarn_get_mscale``: ``0.1 mscale ln(factor) + 1`` (1 for a factor of 1 or less)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0
