"""Qwen3-Next (``qwen3_next``), transformers' Qwen3NextForCausalLM op for op, on LlamaModel.

What differs from the Llama family, each as transformers 5 computes it (models/qwen3_next/modeling_qwen3_next.py):
- three of every four layers (``layer_types``) are Gated DeltaNet ``linear_attention`` layers
  (harness/model/gated_delta.py): no K/V, a fixed state per sequence, which the KV cache holds in the sequence's
  state pages (impls/state_pages.py) and hands the layer each step through ``attention.linear_state(layer)``
  (impls/base.py ``StepAttention``, ``StateRows``);
- the others are gated full attention: ``q_proj`` gives each head's query and an output gate side by side
  (``[T, heads, 2 head_dim]``), the attention's output is multiplied by ``sigmoid(gate)`` before ``o_proj``;
  per-head q/k norms; RoPE on the first ``head_dim * partial_rotary_factor`` dims of each head only. These
  attend through the cache's kernels as any full layer (every paged kernel);
- every RMSNorm (the layers', the q/k norms', the final one) is zero-centred: ``normed * (1 + w)`` in float32
  (Gemma's, harness/model/gemma3.py ``GemmaRMSNorm``); the DeltaNet's gated norm has a plain weight;
- every layer's MLP is the sparse mixture (Qwen3-MoE's router and experts, harness/model/moe.py) plus a shared
  expert of ``shared_expert_intermediate_size`` gated by ``sigmoid(shared_expert_gate(x))``. Dense layers among
  sparse ones (``mlp_only_layers``, ``decoder_sparse_step``) are refused when the config is read
  (harness/model/hf_latent.py).

Parameter names are transformers' minus ``model.``, except the fused ``qkv_proj`` of a full layer (its q rows are
``q_proj``'s query-and-gate rows, then k's, then v's: harness/model/weights.py). The fused C++ element-wise ops
(kernels/dense_op.py) compute Llama's norm and SwiGLU, not these: the model runs torch's. Decodes run eagerly
(a traced decode, cuda_graph's pieces or cpu_compile's graph, would need the state inside the trace).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvbench.harness.model.config import ModelConfig
from kvbench.harness.model.gated_delta import GatedDeltaNet
from kvbench.harness.model.gemma3 import GemmaRMSNorm
from kvbench.harness.model.llama import AttentionFn, Device, Linear, LlamaModel
from kvbench.harness.model.moe import SparseMoE
from kvbench.harness.model.rope import RotaryEmbedding, apply_rotary


def rotary_dims(cfg: ModelConfig) -> int:
    """Dims of each q and k head that RoPE rotates (transformers: ``int(head_dim * partial_rotary_factor)``)."""
    return int(cfg.head_dim * cfg.partial_rotary_factor)


class GatedAttention(nn.Module):
    """Full attention with the output gate, q/k norms and partial RoPE; q/k/v in one GEMM (``qkv_proj``)."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: Device) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size, self.kv_size = cfg.q_size, cfg.kv_size
        self.qkv_proj = Linear(cfg.hidden_size, 2 * cfg.q_size + 2 * cfg.kv_size, cfg.qkv_bias, dtype, device)
        self.o_proj = Linear(cfg.q_size, cfg.hidden_size, cfg.o_bias, dtype, device)
        self.q_norm = GemmaRMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype, device)
        self.k_norm = GemmaRMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype, device)
        self.rotated = rotary_dims(cfg)

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``x [T, heads, head_dim]`` with its first ``rotated`` dims rotated (cos/sin ``[T, rotated]``)."""
        if self.rotated == self.head_dim:
            return apply_rotary(x, cos, sin)
        return torch.cat((apply_rotary(x[..., :self.rotated], cos, sin), x[..., self.rotated:]), dim=-1)

    def forward(self, layer_idx: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attention: AttentionFn) -> torch.Tensor:
        tokens = x.shape[0]
        q_gate, k, v = self.qkv_proj(x).split([2 * self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, gate = q_gate.view(tokens, self.heads, 2 * self.head_dim).chunk(2, dim=-1)
        q = self.rope(self.q_norm(q), cos, sin)
        k = self.rope(self.k_norm(k.reshape(tokens, self.kv_heads, self.head_dim)), cos, sin)
        v = v.reshape(tokens, self.kv_heads, self.head_dim)
        out = attention(layer_idx, q.contiguous(), k.contiguous(), v.contiguous()).reshape(tokens, self.q_size)
        return self.o_proj(out * torch.sigmoid(gate.reshape(tokens, self.q_size)))


class SharedExpert(nn.Module):
    """transformers' Qwen3NextMLP of ``shared_expert_intermediate_size``: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: Device) -> None:
        super().__init__()
        size = cfg.shared_expert_intermediate_size
        self.gate_proj = Linear(cfg.hidden_size, size, False, dtype, device)
        self.up_proj = Linear(cfg.hidden_size, size, False, dtype, device)
        self.down_proj = Linear(size, cfg.hidden_size, False, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SharedExpertMoE(SparseMoE):
    """The routed experts (Qwen3-MoE's) plus the shared expert, weighted by ``sigmoid(shared_expert_gate(x))``."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: Device) -> None:
        super().__init__(cfg, dtype, device)
        self.shared_expert = SharedExpert(cfg, dtype, device) if cfg.shared_expert_intermediate_size else None
        self.shared_expert_gate = Linear(cfg.hidden_size, 1, False, dtype, device) if self.shared_expert else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        routed = super().forward(x)
        if self.shared_expert is None or self.shared_expert_gate is None:
            return routed
        return routed + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)


class Qwen3NextDecoderLayer(nn.Module):
    """A token mixer (gated attention or Gated DeltaNet) and the mixture, each after a zero-centred norm."""

    def __init__(self, cfg: ModelConfig, kind: str, dtype: torch.dtype, device: Device) -> None:
        super().__init__()
        self.input_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.linear = kind == "linear_attention"
        if self.linear:
            self.linear_attn = GatedDeltaNet(cfg, dtype, device)
        else:
            self.self_attn = GatedAttention(cfg, dtype, device)
        self.post_attention_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.mlp = SharedExpertMoE(cfg, dtype, device)

    def forward(self, layer_idx: int, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attention: AttentionFn) -> torch.Tensor:
        x = self.input_layernorm(h)
        if self.linear:
            states = getattr(attention, "linear_state", None)
            if states is None:
                raise TypeError(f"layer {layer_idx} is a linear_attention layer: it needs the cache's state through "
                                "the step's attention object (impls/base.py StepAttention), which this forward was "
                                "not given (a traced decode, cuda_graph or cpu_compile, holds no state)")
            h = h + self.linear_attn(x, states(layer_idx))
        else:
            h = h + self.self_attn(layer_idx, x, cos, sin, attention)
        return h + self.mlp(self.post_attention_layernorm(h))


class Qwen3NextModel(LlamaModel):
    """Qwen3-Next's decoder and logits (untied in every published model; tied honoured)."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: Device) -> None:
        super().__init__(cfg, dtype, device)
        self.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        # RoPE over the rotated dims only: cos/sin [T, rotary_dims]
        self.rotary = RotaryEmbedding(rotary_dims(cfg), cfg.rope_theta, cfg.rope_scaling, device)
        self.requires_grad_(False)

    def make_layer(self, cfg: ModelConfig, layer_idx: int, dtype: torch.dtype,  # type: ignore[override]
                   device: Device) -> Qwen3NextDecoderLayer:
        kind = "full_attention" if cfg.layer_types is None else cfg.layer_types[layer_idx]
        return Qwen3NextDecoderLayer(cfg, kind, dtype, device)

    @staticmethod
    def unit_norm_weight(name: str) -> float:
        """The stored weight that makes norm ``name`` a plain RMS normalisation (build_model's dummy weights): 0
        where the norm scales by ``1 + w``, 1 for the DeltaNet's gated norm (a plain weight)."""
        return 1.0 if name.endswith("linear_attn.norm.weight") else 0.0

    @property
    def fused(self) -> bool:
        return False

    def fuse_elementwise(self, on: bool = True) -> None:
        """Nothing to fuse: kernels/dense_op.py's ops compute Llama's norm and SwiGLU, not these (module doc)."""
