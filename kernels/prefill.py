"""Prefill attention over a sequence's cached context (shared by every impl).

Prefill is not what kvbench compares (decode is), so every impl uses this one
SDPA path: query token ``i`` of the chunk sits at position ``start + i`` and sees
keys ``0 .. start + i``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def prefill_attention(
    q: torch.Tensor, k_ctx: torch.Tensor, v_ctx: torch.Tensor, scale: float
) -> torch.Tensor:
    """q ``[T, H, D]``, k/v ``[L, KVH, D]`` with ``L >= T`` (the last T are the new tokens)."""
    t, length = q.shape[0], k_ctx.shape[0]
    start = length - t
    qh = q.transpose(0, 1).unsqueeze(0)  # [1, H, T, D]
    kh = k_ctx.transpose(0, 1).unsqueeze(0)
    vh = v_ctx.transpose(0, 1).unsqueeze(0)
    if start == 0:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale, enable_gqa=True)
    else:
        pos_q = torch.arange(start, length, device=q.device)[:, None]
        pos_k = torch.arange(length, device=q.device)[None, :]
        out = F.scaled_dot_product_attention(
            qh, kh, vh, attn_mask=pos_k <= pos_q, scale=scale, enable_gqa=True
        )
    return out.squeeze(0).transpose(0, 1)
