"""DeepSeek's mixture (V2 and V3, transformers' ``DeepseekV2Moe`` / ``DeepseekV3MoE``): a router, the routed experts
(harness/model/moe.py's ``Experts``: transformers 5's stacked ``gate_up_proj``/``down_proj`` and its per-expert loop)
and always-on shared experts.

The routers, op for op, in float32 (transformers keeps ``gate.weight`` and ``e_score_correction_bias`` in float32):
- V3 (and Kimi-K2): sigmoid scores; the choice adds ``e_score_correction_bias``; the experts fall in ``n_group``
  groups, each scored by the sum of its two best choices, and only the ``topk_group`` best groups' experts may be
  chosen; the weights are the chosen experts' sigmoid scores (not the biased ones), renormalised when
  ``norm_topk_prob``, times ``routed_scaling_factor``.
- V2: softmax scores; ``greedy`` top-k, or ``group_limited_greedy`` (groups scored by their best expert, the
  others' scores set to 0); the weights times ``routed_scaling_factor`` (V2's router never renormalises).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvbench.harness.model.config import ModelConfig
from kvbench.harness.model.llama import Device, Linear
from kvbench.harness.model.moe import Experts

# transformers' guard against a zero sum when V3's chosen weights are renormalised.
RENORM_EPS = 1e-20


class DeepseekMLP(nn.Module):
    """DeepseekV3MLP with transformers' unfused names (``gate_proj``, ``up_proj``, ``down_proj``): the shared
    experts, ``n_shared_experts x moe_intermediate_size`` wide."""

    def __init__(self, hidden: int, intermediate: int, dtype: torch.dtype, device: Device) -> None:
        super().__init__()
        self.gate_proj = Linear(hidden, intermediate, False, dtype, device)
        self.up_proj = Linear(hidden, intermediate, False, dtype, device)
        self.down_proj = Linear(intermediate, hidden, False, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DeepseekRouter(nn.Module):
    """``mlp.gate``: float32 ``weight [E, hidden]`` and (V3) ``e_score_correction_bias [E]``."""

    def __init__(self, cfg: ModelConfig, device: Device) -> None:
        super().__init__()
        self.v3 = cfg.architecture == "deepseek_v3"
        self.top_k, self.experts = cfg.num_experts_per_tok, cfg.num_experts
        self.groups, self.top_groups = cfg.n_group, cfg.topk_group
        self.grouped = self.v3 or cfg.topk_method == "group_limited_greedy"
        self.norm_topk_prob = self.v3 and cfg.norm_topk_prob
        self.scaling = cfg.routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden_size, dtype=torch.float32, device=device))
        if self.v3:
            self.e_score_correction_bias = nn.Parameter(torch.empty(cfg.num_experts, dtype=torch.float32,
                                                                    device=device))

    def group_mask(self, group_scores: torch.Tensor) -> torch.Tensor:
        """``[T, E]`` True where an expert's group is among the token's ``topk_group`` best."""
        chosen = torch.topk(group_scores, k=self.top_groups, dim=-1, sorted=False)[1]
        mask = torch.zeros_like(group_scores).scatter_(1, chosen, 1)
        per_group = self.experts // self.groups
        return mask.unsqueeze(-1).expand(-1, self.groups, per_group).reshape(-1, self.experts).bool()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [T, hidden]`` -> each token's chosen experts ``[T, k]`` and their float32 weights ``[T, k]``."""
        logits = F.linear(x.float(), self.weight.float())
        if self.v3:
            scores = logits.sigmoid()
            choice = scores + self.e_score_correction_bias
            grouped = choice.view(-1, self.groups, self.experts // self.groups)
            choice = choice.masked_fill(~self.group_mask(grouped.topk(2, dim=-1)[0].sum(dim=-1)), float("-inf"))
            chosen = torch.topk(choice, k=self.top_k, dim=-1, sorted=False)[1]
            weights = scores.gather(1, chosen)
            if self.norm_topk_prob:
                weights = weights / (weights.sum(dim=-1, keepdim=True) + RENORM_EPS)
        else:
            scores = logits.softmax(dim=-1, dtype=torch.float32)
            if self.grouped:
                grouped = scores.view(-1, self.groups, self.experts // self.groups)
                scores = scores.masked_fill(~self.group_mask(grouped.max(dim=-1).values), 0.0)
            weights, chosen = torch.topk(scores, k=self.top_k, dim=-1, sorted=False)
        return chosen, weights * self.scaling


class DeepseekMoE(nn.Module):
    """Router (``mlp.gate``), routed experts (``mlp.experts``) and shared experts (``mlp.shared_experts``)."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: Device) -> None:
        super().__init__()
        self.gate = DeepseekRouter(cfg, device)
        self.experts = Experts(cfg, dtype, device)
        self.shared_experts = DeepseekMLP(cfg.hidden_size, cfg.moe_intermediate_size * cfg.n_shared_experts,
                                          dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chosen, weights = self.gate(x)
        return self.experts(x, chosen, weights) + self.shared_experts(x)
