"""DeepSeek-V2 and DeepSeek-V3 (and Kimi-K2, which is V3) as harness/model/llama.py's decoder with multi-head latent
attention (MLA) and DeepSeek's mixture (harness/model/deepseek_moe.py), as transformers 5 computes them.

**What the cache holds, and how it attends (the absorbed formulation, FlashMLA's).** transformers' MLA expands
each token's normed latent ``c`` (``kv_lora_rank`` values) through ``kv_b_proj`` into every head's K-nope
``W_UK[h] c`` and V ``W_UV[h] c``, and attends with ``K[h] = [W_UK[h] c ; k_pe]`` (``k_pe`` the shared rotary key).
Because ``q_nope[h] . W_UK[h] c = (W_UK[h]^T q_nope[h]) . c`` and the softmax-weighted sum of ``W_UV[h] c`` is
``W_UV[h]`` times the weighted sum of ``c``, the same attention is ordinary attention with ONE kv head of width
``Dk = kv_lora_rank + qk_rope_head_dim`` whose key and value are the same stored vector ``[c ; k_pe]``:

- the model hands the cache ``q = [q_nope W_UK ; q_pe]`` ``[T, H, Dk]`` and ``k = v = [c ; k_pe]`` ``[T, 1, Dk]``;
- the cache stores that one tensor per layer (impls/base.py aliases its V store to its K store for a latent cache:
  the bytes are the latent's, 576 values a token and layer for DeepSeek-V3) and attends with its usual kernels,
  at the model's scale ``(qk_nope + qk_rope) ** -0.5`` (times yarn's mscale squared, ModelConfig.softmax_scale);
- of the output ``[T, H, Dk]`` the first ``kv_lora_rank`` values are each head's weighted latent (the last
  ``qk_rope_head_dim`` are the weighted rotary keys, discarded); ``project_out`` applies ``W_UV`` per head, then
  ``o_proj``.

Prefill attends the same way (no expansion): every impl and kernel computes one formulation. The arithmetic is
transformers' reassociated (products into the latent space first), equal up to float rounding: the parity tests
(tests/unit/harness/serving/test_engine_parity_deepseek.py) compare greedy tokens at float32.

The rotary part follows each family's convention: V3 with ``rope_interleave`` (as published) and V2 (always: its
complex-number rotation) rotate interleaved pairs; both are computed as the de-interleaved halves rotated by
``apply_rotary`` (the permutation is the same for q and k, so their dot products are transformers'). yarn's
cos/sin factor is ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)`` (transformers'
``_compute_yarn_parameters``).
"""

from __future__ import annotations

import torch
from torch import nn

from kvbench.harness.errors import ConfigError
from kvbench.harness.model.config import ModelConfig, RopeScaling, yarn_mscale
from kvbench.harness.model.deepseek_moe import DeepseekMLP, DeepseekMoE
from kvbench.harness.model.llama import MLP, QKV, DecoderLayer, Device, LlamaModel, Linear, RMSNorm
from kvbench.harness.model.rope import apply_rotary

# transformers' DeepseekV2/V3RMSNorm default: the q and kv latent norms are built without config.rms_norm_eps.
LATENT_NORM_EPS = 1e-6


def deinterleave(x: torch.Tensor) -> torch.Tensor:
    """Interleaved pairs ``(x0, x1), (x2, x3) ...`` -> halves ``(x0, x2 ...), (x1, x3 ...)``: rotate_half's layout."""
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)


def yarn_cos_sin_factor(scaling: RopeScaling) -> float:
    """DeepSeek's yarn factor on cos and sin: mscale's ratio where both mscale keys are set, else mscale(factor)."""
    if scaling.mscale and scaling.mscale_all_dim:
        return yarn_mscale(scaling.factor, scaling.mscale) / yarn_mscale(scaling.factor, scaling.mscale_all_dim)
    return yarn_mscale(scaling.factor)


class LatentAttention(nn.Module):
    """MLA's projections (transformers' names: ``q_proj`` or ``q_a_proj``/``q_a_layernorm``/``q_b_proj``,
    ``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``, ``o_proj``) around the cache's attention, in the
    absorbed formulation (this module's docstring)."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: Device) -> None:
        super().__init__()
        self.num_heads, self.rank = cfg.num_heads, cfg.kv_lora_rank
        self.nope, self.rope, self.v_dim = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.interleaved = cfg.architecture == "deepseek_v2" or cfg.rope_interleave
        q_width, bias = cfg.num_heads * (self.nope + self.rope), cfg.qkv_bias  # attention_bias
        if cfg.q_lora_rank is None:
            self.q_proj: Linear | None = Linear(cfg.hidden_size, q_width, False, dtype, device)
        else:
            self.q_proj = None
            self.q_a_proj = Linear(cfg.hidden_size, cfg.q_lora_rank, bias, dtype, device)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, LATENT_NORM_EPS, dtype, device)
            self.q_b_proj = Linear(cfg.q_lora_rank, q_width, False, dtype, device)
        self.kv_a_proj_with_mqa = Linear(cfg.hidden_size, self.rank + self.rope, bias, dtype, device)
        self.kv_a_layernorm = RMSNorm(self.rank, LATENT_NORM_EPS, dtype, device)
        self.kv_b_proj = Linear(self.rank, cfg.num_heads * (self.nope + self.v_dim), False, dtype, device)
        self.o_proj = Linear(cfg.num_heads * self.v_dim, cfg.hidden_size, bias, dtype, device)

    def up_projections(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``kv_b_proj`` per head: ``W_UK [H, qk_nope, rank]`` and ``W_UV [H, v_head_dim, rank]`` (views)."""
        w = self.kv_b_proj.weight.view(self.num_heads, self.nope + self.v_dim, self.rank)
        return w[:, : self.nope], w[:, self.nope :]

    def queries(self, x: torch.Tensor) -> torch.Tensor:
        """``[T, H, qk_nope + qk_rope]``: one projection (V2-Lite) or through the q latent and its norm."""
        q = self.q_proj(x) if self.q_proj is not None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        return q.view(x.shape[0], self.num_heads, self.nope + self.rope)

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The rotary part ``[T, heads, qk_rope]`` rotated by the family's convention (this module's docstring)."""
        return apply_rotary(deinterleave(x) if self.interleaved else x, cos, sin)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> QKV:
        """What the cache takes: the absorbed queries ``[T, H, rank + rope]`` and the stored vector ``[c ; k_pe]``
        ``[T, 1, rank + rope]`` as both key and value (one tensor: the cache stores it once)."""
        q = self.queries(x)
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        latent, k_pe = self.kv_a_proj_with_mqa(x).split([self.rank, self.rope], dim=-1)
        latent = self.kv_a_layernorm(latent.contiguous())
        w_uk, _ = self.up_projections()
        q_latent = torch.einsum("thn,hnr->thr", q_nope, w_uk)
        q_abs = torch.cat((q_latent, self.rotate(q_pe, cos, sin)), dim=-1)
        k = torch.cat((latent, self.rotate(k_pe[:, None, :], cos, sin)[:, 0]), dim=-1)[:, None, :]
        return q_abs.contiguous(), k, k

    def project_out(self, attn: torch.Tensor) -> torch.Tensor:
        """The cache's ``[T, H, rank + rope]`` output -> ``[T, hidden]``: each head's weighted latent through its
        ``W_UV``, then ``o_proj``."""
        _, w_uv = self.up_projections()
        values = torch.einsum("thr,hvr->thv", attn[..., : self.rank], w_uv)
        return self.o_proj(values.reshape(attn.shape[0], self.num_heads * self.v_dim))


class DeepseekDecoderLayer(DecoderLayer):
    """Llama's layer (norm, attention, residual, norm, MLP, residual) with MLA, and a dense MLP in the first
    ``first_k_dense_replace`` layers, DeepSeek's mixture after them."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, dtype: torch.dtype, device: Device) -> None:
        nn.Module.__init__(self)  # DecoderLayer's would allocate Llama's attention first
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.self_attn = LatentAttention(cfg, dtype, device)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        dense = layer_idx < cfg.first_k_dense_replace
        self.mlp: nn.Module = MLP(cfg, dtype, device) if dense else DeepseekMoE(cfg, dtype, device)


def check_deepseek(cfg: ModelConfig) -> None:
    """The shape MLA and DeepSeek's router need, one ConfigError naming the key (a named config could set any)."""
    for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "num_experts",
                "num_experts_per_tok", "moe_intermediate_size"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"model.{key}={getattr(cfg, key)} must be a positive integer for "
                              f"model.architecture={cfg.architecture} (multi-head latent attention and its experts)")
    if cfg.head_dim != cfg.qk_rope_head_dim:
        raise ConfigError(f"model.head_dim={cfg.head_dim} must equal model.qk_rope_head_dim={cfg.qk_rope_head_dim} "
                          "(DeepSeek's RoPE rotates the shared rotary key)")
    if cfg.num_experts % cfg.n_group or not 1 <= cfg.topk_group <= cfg.n_group:
        raise ConfigError(f"model.n_group={cfg.n_group} must divide model.num_experts={cfg.num_experts} and "
                          f"model.topk_group={cfg.topk_group} be in [1, n_group]")
    grouped = cfg.architecture == "deepseek_v3" or cfg.topk_method == "group_limited_greedy"
    if grouped and cfg.num_experts_per_tok > cfg.topk_group * (cfg.num_experts // cfg.n_group):
        raise ConfigError(f"model.num_experts_per_tok={cfg.num_experts_per_tok} exceeds the experts of "
                          f"model.topk_group={cfg.topk_group} groups of {cfg.num_experts // cfg.n_group}")
    methods = ("greedy", "group_limited_greedy") if cfg.architecture == "deepseek_v2" else ("noaux_tc", "greedy")
    if cfg.topk_method not in methods:
        raise ConfigError(f"model.topk_method={cfg.topk_method!r} for {cfg.architecture}; "
                          f"allowed: {', '.join(methods)}")


class DeepseekModel(LlamaModel):
    """DeepseekV2ForCausalLM / DeepseekV3ForCausalLM: parameter names are transformers' minus ``model.``, except
    the dense layers' fused ``gate_up_proj`` (harness/model/weights.py maps gate/up into it)."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: Device) -> None:
        check_deepseek(cfg)
        super().__init__(cfg, dtype, device)
        scaling = cfg.rope_scaling
        if scaling is not None and scaling.rope_type == "yarn":
            self.rotary.attention_factor = yarn_cos_sin_factor(scaling)

    def make_layer(self, cfg: ModelConfig, layer_idx: int, dtype: torch.dtype, device: Device) -> DecoderLayer:
        return DeepseekDecoderLayer(cfg, layer_idx, dtype, device)


__all__ = ["DeepseekModel", "DeepseekMLP", "LatentAttention", "deinterleave"]
