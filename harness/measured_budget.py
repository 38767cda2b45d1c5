"""The KV budget of a run with a real model: on a GPU, the activation peak is measured once
(vLLM's profile run over the largest forward the engine runs); elsewhere it is estimated."""

from __future__ import annotations

import torch

from harness.budget import MemoryBudget, forward_tokens_bound, kv_budget, logits_rows_bound
from harness.context import RunContext
from kernels.prefill import prefill_attention


def measure_activation_peak(ctx: RunContext, num_tokens: int, logits_rows: int) -> int | None:
    """GPU: the allocator peak of one forward over ``num_tokens`` tokens keeping ``logits_rows``
    rows of logits, the largest forward the engine runs (vLLM's profile run)."""
    if ctx.device.type != "cuda":
        return None
    model, scale = ctx.model, ctx.cfg.model.head_dim**-0.5
    ids = torch.zeros(num_tokens, dtype=torch.long, device=ctx.device)
    pos = torch.arange(num_tokens, device=ctx.device)
    at = torch.arange(max(0, num_tokens - logits_rows), num_tokens, device=ctx.device)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.inference_mode():
        model(ids, pos, lambda layer, q, k, v: prefill_attention(q, k, v, scale), at)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def budget_for(ctx: RunContext) -> MemoryBudget:
    """The KV budget, measured once per run and shared by every impl of the run."""
    if "budget" not in ctx.memo:
        total = torch.cuda.get_device_properties(0).total_memory if ctx.device.type == "cuda" else None
        prompt_lens = [len(r.prompt_ids) for r in ctx.requests]
        if total is None:  # the analytic budget first: one that leaves nothing fails before any weight is built
            kv_budget(ctx.cfg, None, None, None, prompt_lens)
        # Captured first, as vLLM does: the graphs' memory is held for the whole run, so the KV cache gets none of it.
        pieces = ctx.decode_pieces
        act = measure_activation_peak(ctx, forward_tokens_bound(ctx.cfg, prompt_lens), logits_rows_bound(ctx.cfg))
        ctx.memo["budget"] = kv_budget(ctx.cfg, total, ctx.model.num_parameter_bytes(), act, prompt_lens,
                                       pieces.pool_bytes if pieces is not None else 0)
    return ctx.memo["budget"]
