"""gpt-oss (20B, 120B) as harness/model/llama.py's decoder with gpt-oss's layers, as transformers 5 computes it.

What differs from Llama, each where transformers' ``modeling_gpt_oss.py`` puts it:
- attention: q/k/v/o biased (``attention_bias``; llama.py's Attention), sliding (``sliding_window``) and full
  layers alternating (the cache's windows, harness/kv/factory.py), and per head a learned sink: a logit that joins
  every softmax's denominator and adds no value. The model holds the sinks (HF's ``self_attn.sinks``); the cache's
  kernels apply them (``layer_sinks``, which harness/serving/engine.py hands to ``KVCache.set_layer_sinks``).
- RoPE: yarn with its attention factor on cos and sin (harness/model/rope_yarn.py, through llama.py's rotary).
- RMSNorm: the weight multiplies in float32 before the cast back (Llama casts first); the same at float32.
- the MLP: a router (linear with bias; top-k of its logits, softmax over those k) and routed experts with biases
  and a clamped SwiGLU: gate and up interleaved in ``gate_up_proj`` (columns 0, 2, 4 ... gate; 1, 3, 5 ... up),
  ``gate <= limit``, ``-limit <= up <= limit``, ``(up + 1) * gate * sigmoid(1.702 gate)``.

The experts are held as transformers holds them (``gate_up_proj [E, H, 2I]``, ``down_proj [E, I, H]``, x @ W + b),
so a checkpoint it saved loads tensor for tensor. An MXFP4 checkpoint (the published files) is refused
(harness/model/support.py); named configs with ``expert_dtype: mxfp4`` run dummy experts at the run's dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvbench.harness.errors import ConfigError
from kvbench.harness.model.config import ModelConfig
from kvbench.harness.model.llama import Attention, DecoderLayer, Device, LlamaModel, Linear, RMSNorm

# transformers' GptOssConfig.swiglu_alpha: the sigmoid's gain in the experts' gated activation.
SWIGLU_ALPHA = 1.702


class GptOssRMSNorm(RMSNorm):
    """GptOssRMSNorm: ``(weight * normed).to(dtype)`` in float32 (Llama: ``weight * normed.to(dtype)``)."""

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        var = x32.pow(2).mean(-1, keepdim=True)
        var += self.eps
        # transformers keeps these weights in float32 (_keep_in_fp32_modules): the product is float32 either way.
        return (self.weight.float() * (x32 * var.rsqrt_())).to(x.dtype)


class SinkAttention(Attention):
    """llama.py's Attention (q/k/v/o bias from the config) and the layer's learned sinks, one logit per q head."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: Device) -> None:
        super().__init__(cfg, dtype, device)
        self.sinks = nn.Parameter(torch.empty(cfg.num_heads, dtype=dtype, device=device))


def clamped_swiglu(gate_up: torch.Tensor, limit: float) -> torch.Tensor:
    """GptOssExperts._apply_gate on the interleaved ``[rows, 2I]`` projection -> ``[rows, I]``."""
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    gate = gate.clamp(min=None, max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * SWIGLU_ALPHA))


class GptOssExperts(nn.Module):
    """``num_experts`` experts of ``moe_intermediate_size`` (HF's ``mlp.experts.*``), with biases."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: Device) -> None:
        super().__init__()
        e, h, i = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
        assert cfg.swiglu_limit is not None, "gpt-oss's experts clamp at swiglu_limit"
        self.limit = cfg.swiglu_limit
        # allocated, not initialised (build_model fills them), as llama.py's Linear
        self.gate_up_proj = nn.Parameter(torch.empty(e, h, 2 * i, dtype=dtype, device=device))
        self.gate_up_proj_bias = nn.Parameter(torch.empty(e, 2 * i, dtype=dtype, device=device))
        self.down_proj = nn.Parameter(torch.empty(e, i, h, dtype=dtype, device=device))
        self.down_proj_bias = nn.Parameter(torch.empty(e, h, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``x [T, H]``, each token's ``chosen [T, k]`` experts and their ``weights [T, k]`` -> ``[T, H]``.

        Each (token, slot) pair's weighted expert output, summed over the slots: the order of transformers'
        default experts path (grouped_mm), so the sums match it bit for bit wherever the GEMMs do."""
        if torch.compiler.is_compiling() or (x.is_cuda and torch.cuda.is_current_stream_capturing()):
            return self.every_expert(x, chosen, weights)
        picked = x.new_empty(*chosen.shape, x.shape[-1])  # [T, k, H]
        for expert in torch.unique(chosen).tolist():  # the experts this batch routes to (a host sync a layer)
            token, slot = torch.where(chosen == expert)
            gate_up = x[token] @ self.gate_up_proj[expert] + self.gate_up_proj_bias[expert]
            y = clamped_swiglu(gate_up, self.limit) @ self.down_proj[expert] + self.down_proj_bias[expert]
            picked[token, slot] = y * weights[token, slot, None]
        return picked.sum(dim=1)

    def every_expert(self, x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """The same mixture with no data-dependent control flow, for traced graphs (cpu_compile's, cuda_graph's
        pieces): every expert on every token, each token's output weighted over its chosen ones (the others 0)."""
        dense = torch.zeros(x.shape[0], self.gate_up_proj.shape[0], dtype=weights.dtype, device=x.device)
        dense.scatter_(1, chosen, weights)  # [T, E]
        gate_up = torch.einsum("th,ehi->eti", x, self.gate_up_proj) + self.gate_up_proj_bias[:, None, :]
        y = torch.einsum("eti,eih->eth", clamped_swiglu(gate_up, self.limit), self.down_proj)
        y = y + self.down_proj_bias[:, None, :]  # [E, T, H]
        return torch.einsum("eth,te->th", y, dense).to(x.dtype)


class GptOssMoE(nn.Module):
    """GptOssMLP: the router (HF's ``mlp.router``, a linear with bias) and the routed experts."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: Device) -> None:
        super().__init__()
        self.top_k = cfg.num_experts_per_tok
        self.router = Linear(cfg.hidden_size, cfg.num_experts, True, dtype, device)
        self.experts = GptOssExperts(cfg, dtype, device)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's chosen experts ``[T, k]`` and their weights: a softmax over the top-k logits alone, in
        the logits' dtype (GptOssTopKRouter)."""
        top, chosen = torch.topk(self.router(x), self.top_k, dim=-1)
        return chosen, F.softmax(top, dim=1, dtype=top.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chosen, weights = self.route(x)
        return self.experts(x, chosen, weights)


class GptOssDecoderLayer(DecoderLayer):
    """Llama's layer (norm, attention, residual, norm, MLP, residual) with gpt-oss's modules in it."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: Device) -> None:
        # DecoderLayer.__init__ would allocate Llama's modules only to be replaced (Qwen3-MoE's experts, at
        # gpt-oss-120b's size): the same attributes, built once as gpt-oss's.
        nn.Module.__init__(self)
        self.input_layernorm = GptOssRMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.self_attn = SinkAttention(cfg, dtype, device)
        self.post_attention_layernorm = GptOssRMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.mlp = GptOssMoE(cfg, dtype, device)


class GptOssModel(LlamaModel):
    """GptOssForCausalLM's decoder and lm_head; parameter names are HF's minus ``model.``, except the fused
    ``qkv_proj`` (harness/model/weights.py maps q/k/v into it)."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: Device) -> None:
        if not (cfg.is_moe and cfg.attention_sinks and cfg.swiglu_limit is not None):
            # every gpt-oss has all three (transformers' GptOssConfig cannot turn them off)
            raise ConfigError(f"model.architecture=gpt_oss needs model.num_experts > 0, model.attention_sinks=true and "
                              f"a model.swiglu_limit > 0; got num_experts={cfg.num_experts}, attention_sinks="
                              f"{cfg.attention_sinks}, swiglu_limit={cfg.swiglu_limit}")
        super().__init__(cfg, dtype, device)
        self.norm = GptOssRMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.requires_grad_(False)

    def make_layer(self, cfg: ModelConfig, layer_idx: int, dtype: torch.dtype, device: Device) -> DecoderLayer:
        return GptOssDecoderLayer(cfg, dtype, device)

    def layer_sinks(self) -> list[torch.Tensor]:
        """Every layer's sinks as float32 ``[num_heads]`` (a copy: the cache keeps its own)."""
        return [layer.self_attn.sinks.detach().float().clone() for layer in self.layers]
