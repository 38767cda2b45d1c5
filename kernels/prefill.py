"""Prefill attention over a sequence's cached context (shared by every impl).

Prefill is not what kvbench compares (decode is), so every impl uses this one
SDPA path: query token ``i`` of the chunk sits at position ``start + i`` and sees
keys ``0 .. start + i``.
"""

from __future__ import annotations

import torch

from kvbench.kernels.sdpa import grouped_sdpa


def prefill_attention(
    q: torch.Tensor, k_ctx: torch.Tensor, v_ctx: torch.Tensor, scale: float
) -> torch.Tensor:
    """q ``[T, H, D]``, k/v ``[L, KVH, D]`` with ``L >= T`` (the last T are the new tokens)."""
    t, length = q.shape[0], k_ctx.shape[0]
    qh = q.transpose(0, 1).unsqueeze(0)  # [1, H, T, D]
    kh = k_ctx.transpose(0, 1).unsqueeze(0)
    vh = v_ctx.transpose(0, 1).unsqueeze(0)
    mask = None
    if length > t:  # cached prefix: query i sits at position length - t + i
        pos_q = torch.arange(length - t, length, device=q.device)[:, None]
        mask = (torch.arange(length, device=q.device)[None, :] <= pos_q)[None, None]
    # Prompt lengths differ from call to call: keep to backends that do not re-plan per shape.
    out = grouped_sdpa(qh.contiguous(), kh, vh, scale, mask=mask, is_causal=mask is None, varying_shapes=True)
    return out.squeeze(0).transpose(0, 1)
