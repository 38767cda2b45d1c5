"""Qwen3-MoE's sparse MLP: a router picks each token's top-k experts, whose SwiGLU outputs are summed by weight.

transformers' Qwen3MoeSparseMoeBlock op for op (its eager experts loop): softmax of the router logits in fp32,
top-k, renormalised to sum to 1 when ``norm_topk_prob``, cast back; then per expert that any token chose, in
expert order, its tokens' ``down(silu(gate) * up)`` times their weight, added into the output. The experts are
held as transformers 5 holds them (``gate_up_proj [E, 2I, H]``, ``down_proj [E, H, I]``), so a checkpoint it
wrote loads tensor for tensor; harness/model/weights.py also slices a per-expert checkpoint into them.

The loop visits only the experts chosen in this batch (a host sync per layer for their ids): the work is that
of the chosen experts, as a serving engine's grouped GEMM does, not of all of them. A traced graph (cpu_compile's
one graph, cuda_graph's pieces) cannot hold that data-dependent loop: there every expert runs on every token and
the unchosen ones weigh 0, the same sums at num_experts / num_experts_per_tok times the expert work.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvbench.harness.model.config import ModelConfig
from kvbench.harness.model.llama import Device, Linear


class SparseMoE(nn.Module):
    """Router (HF's ``mlp.gate``) and routed experts (``mlp.experts.gate_up_proj`` / ``down_proj``)."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: Device) -> None:
        super().__init__()
        self.top_k, self.norm_topk_prob = cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.gate = Linear(cfg.hidden_size, cfg.num_experts, False, dtype, device)
        self.experts = Experts(cfg, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.gate(x)
        probs = F.softmax(logits, dim=-1, dtype=torch.float)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)  # [T, k]
        if self.norm_topk_prob:
            weights /= weights.sum(dim=-1, keepdim=True)
        return self.experts(x, chosen, weights.to(logits.dtype))


class Experts(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: Device) -> None:
        super().__init__()
        e, h, i = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
        # allocated, not initialised (build_model fills them), as llama.py's Linear
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * i, h, dtype=dtype, device=device))
        self.down_proj = nn.Parameter(torch.empty(e, h, i, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``x [T, H]``, each token's ``chosen [T, k]`` experts and their ``weights [T, k]`` -> ``[T, H]``."""
        if torch.compiler.is_compiling() or (x.is_cuda and torch.cuda.is_current_stream_capturing()):
            return self.every_expert(x, chosen, weights)
        out = torch.zeros_like(x)
        for expert in torch.unique(chosen).tolist():
            # (slot, token) pairs ordered by slot, then token: the order HF's index_add_ accumulates in.
            slot, token = torch.where((chosen == expert).T)
            gate, up = F.linear(x[token], self.gate_up_proj[expert]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.down_proj[expert]) * weights[token, slot, None]
            out.index_add_(0, token, y.to(out.dtype))
        return out

    def every_expert(self, x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """The same mixture with no data-dependent control flow, for traced graphs: all experts on all tokens,
        each token's output the weighted sum over its chosen ones (the others weigh 0)."""
        dense = torch.zeros(x.shape[0], self.gate_up_proj.shape[0], dtype=weights.dtype, device=x.device)
        dense.scatter_(1, chosen, weights)  # [T, E]
        gate, up = torch.einsum("th,eih->eti", x, self.gate_up_proj).chunk(2, dim=-1)
        y = torch.einsum("eti,ehi->eth", F.silu(gate) * up, self.down_proj)  # [E, T, H]
        return torch.einsum("eth,te->th", y, dense).to(x.dtype)
