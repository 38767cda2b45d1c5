"""Gemma 3's language model (``gemma3_text``), transformers' Gemma3ForCausalLM op for op, on LlamaModel.

What differs from the Llama family, each as transformers 5 computes it (models/gemma3/modeling_gemma3.py):
- the embeddings are multiplied by ``sqrt(hidden_size)``, that scalar rounded to the weights' dtype first;
- every RMSNorm (the layers', the q/k norms', the final one) is ``x * rsqrt(mean(x^2) + eps) * (1 + w)`` in float32,
  cast back at the end: the stored weight is an offset from 1;
- four norms a layer ("sandwich"): input, post_attention (on the attention's output, before the residual add),
  pre_feedforward and post_feedforward (on the MLP's output, before the add);
- the softmax scale is ``query_pre_attn_scalar ** -0.5`` (``ModelConfig.softmax_scale``, applied by the KV cache);
- RoPE per layer kind: sliding layers rotate with ``rope_local_theta`` and no scaling, full layers with
  ``rope_theta`` and ``rope_scaling`` (linear, by 8, in Gemma-3-27B);
- GeGLU (``gelu_pytorch_tanh``) MLP, and the logits soft-capped by ``tanh(x / cap) * cap`` when
  ``final_logit_softcapping`` is set. Attention soft-capping (null in every Gemma 3) is refused
  (harness/model/support.py): no kernel computes it.

RoPE of both kinds travels as one ``(cos, sin)`` pair of LlamaModel's shape ``[T, head_dim]``: RoPE's cos and sin
repeat their first half (transformers' ``cat((freqs, freqs))``), so the pair carries the sliding layers' first
half and the full layers' first half side by side, and each layer rebuilds its kind's ``[T, head_dim]``. Every
path that drives LlamaModel's pieces (the eager forward, cpu_compile's graph, cuda_graph's pieces with their
``[N, head_dim]`` buffers) then runs Gemma unchanged.

The fused C++ element-wise ops (kernels/dense_op.py) compute Llama's norm and SwiGLU, not these: a Gemma model runs
torch's element-wise ops (``fuse_elementwise`` leaves it unfused; its rows say ``elementwise_backend=torch``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvbench.harness.model.config import ModelConfig
from kvbench.harness.model.llama import QKV, Attention, AttentionFn, Device, LlamaModel, MLP, linear
from kvbench.harness.model.rope import RotaryEmbedding

# Index of each layer kind's half in the packed cos/sin (``Gemma3Model.embed``).
ROPE_SLOT = {"sliding_attention": 0, "full_attention": 1}


class GemmaRMSNorm(nn.Module):
    """transformers' Gemma3RMSNorm: normalised and scaled by ``1 + weight`` in float32, then cast back."""

    def __init__(self, size: int, eps: float, dtype: torch.dtype, device: Device) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(size, dtype=dtype, device=device))  # filled by build_model
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.reference(x)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """Over the last dimension of ``x`` (any leading shape: the per-head q/k norms too)."""
        x32 = x.float()
        var = x32.pow(2).mean(-1, keepdim=True)
        var += self.eps
        # transformers' order: (x * rsqrt(var + eps)) * (1 + w), all float32, one cast at the end.
        return ((x32 * var.rsqrt_()) * (1.0 + self.weight.float())).to(x.dtype)


class GemmaAttention(Attention):
    """Llama's attention with Gemma's q/k norms (``split_norm_rotate`` calls their ``reference``)."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: Device) -> None:
        super().__init__(cfg, dtype, device)
        if cfg.qk_norm:  # every Gemma 3 has them; a named config could turn them off
            self.q_norm = GemmaRMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype, device)
            self.k_norm = GemmaRMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype, device)


class GatedMLP(MLP):
    """``down(act(gate) * up)`` with the config's activation: GeGLU (gelu_pytorch_tanh, Gemma's) or SwiGLU."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: Device) -> None:
        super().__init__(cfg, dtype, device)
        self.tanh_gelu = cfg.hidden_act == "gelu_pytorch_tanh"

    def activate(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return (F.gelu(gate, approximate="tanh") if self.tanh_gelu else F.silu(gate)) * up


class Gemma3DecoderLayer(nn.Module):
    """Sandwich norms around attention and MLP; the layer's kind picks its RoPE from the packed pair."""

    def __init__(self, cfg: ModelConfig, kind: str, dtype: torch.dtype, device: Device) -> None:
        super().__init__()
        norm = lambda: GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)  # noqa: E731
        self.input_layernorm = norm()
        self.self_attn = GemmaAttention(cfg, dtype, device)
        self.post_attention_layernorm = norm()
        self.pre_feedforward_layernorm = norm()
        self.mlp = GatedMLP(cfg, dtype, device)
        self.post_feedforward_layernorm = norm()
        self.half = cfg.head_dim // 2
        self.slot = ROPE_SLOT[kind]

    def rope(self, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer kind's ``[T, head_dim]`` cos and sin out of the packed pair (``Gemma3Model.embed``)."""
        first = self.slot * self.half
        c, s = cos[:, first:first + self.half], sin[:, first:first + self.half]
        return torch.cat((c, c), dim=-1), torch.cat((s, s), dim=-1)

    def before_attention(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> QKV:
        return self.self_attn.qkv(self.input_layernorm(h), *self.rope(cos, sin))

    def after_attention(self, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        h = h + self.post_attention_layernorm(self.self_attn.project_out(attn))
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))

    def forward(self, layer_idx: int, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attention: AttentionFn) -> torch.Tensor:
        return self.after_attention(h, attention(layer_idx, *self.before_attention(h, cos, sin)))


class Gemma3Model(LlamaModel):
    """Gemma 3's decoder and tied logits; parameter names as transformers' Gemma3ForCausalLM minus ``model.``,
    except the fused ``qkv_proj`` and ``gate_up_proj`` (harness/model/weights.py splits the checkpoint's)."""

    # The stored norm weight that makes a norm a plain RMS normalisation (harness/model/weights.py's dummy weights).
    UNIT_NORM_WEIGHT = 0.0

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: Device) -> None:
        super().__init__(cfg, dtype, device)
        self.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        # transformers keeps sqrt(hidden) as a float32 scalar and casts it to the weights' dtype at each use
        # (bf16 rounds sqrt(5376) = 73.32 to 73.5); the product is then taken in that dtype.
        scale = torch.tensor(cfg.hidden_size**0.5, dtype=torch.float32).to(dtype)
        self.register_buffer("embed_scale", scale.to(device), persistent=False)
        # Full layers: LlamaModel's rotary (rope_theta, rope_scaling); sliding layers: their own base, unscaled.
        local_theta = cfg.rope_theta if cfg.rope_local_theta is None else cfg.rope_local_theta
        self.rotary_local = RotaryEmbedding(cfg.head_dim, local_theta, None, device)
        self.requires_grad_(False)

    def make_layer(self, cfg: ModelConfig, layer_idx: int, dtype: torch.dtype,  # type: ignore[override]
                   device: Device) -> Gemma3DecoderLayer:
        kind = "full_attention" if cfg.layer_types is None else cfg.layer_types[layer_idx]
        return Gemma3DecoderLayer(cfg, kind, dtype, device)

    def embed(self, input_ids: torch.Tensor,
              positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The scaled embeddings, and both kinds' RoPE packed into one ``[T, head_dim]`` cos/sin pair: the
        sliding layers' first half, then the full layers' (each computed whole, as transformers does, then cut)."""
        h = self.embed_tokens(input_ids) * self.embed_scale
        half = self.cfg.head_dim // 2
        cos_l, sin_l = self.rotary_local(positions, h.dtype)
        cos_g, sin_g = self.rotary(positions, h.dtype)
        cos = torch.cat((cos_l[:, :half], cos_g[:, :half]), dim=-1)
        return h, cos, torch.cat((sin_l[:, :half], sin_g[:, :half]), dim=-1)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm, the vocab projection and (if set) the soft cap ``tanh(x / cap) * cap``, as float32."""
        head = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        logits = linear(self.norm(h), head, None, self.head_packed)
        cap = self.cfg.final_logit_softcapping
        if cap is not None:  # in the model's dtype, as transformers does
            logits = torch.tanh(logits / cap) * cap
        return logits.float()

    @property
    def fused(self) -> bool:
        return False

    def fuse_elementwise(self, on: bool = True) -> None:
        """Nothing to fuse: kernels/dense_op.py's ops compute Llama's norm and SwiGLU, not Gemma's (module doc)."""
