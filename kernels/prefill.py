"""Prefill attention over a sequence's cached context (shared by every impl).

Prefill is not what kvbench compares (decode is), so every impl uses this one
SDPA path: query token ``i`` of the chunk sits at position ``start + i`` and sees
keys ``0 .. start + i``; in a sliding-window layer only the last ``window`` of them,
``start + i - window + 1 .. start + i`` (transformers' ``kv_idx > q_idx - window``). A layer with
attention sinks (kernels/sinks.py) adds each head's sink to every query's softmax denominator.
"""

from __future__ import annotations

import torch

from kvbench.kernels.sdpa import grouped_sdpa, sink_sdpa


def prefill_attention(
    q: torch.Tensor, k_ctx: torch.Tensor, v_ctx: torch.Tensor, scale: float, window: int = 0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q ``[T, H, D]``, k/v ``[L, KVH, D]`` with ``L >= T`` (the last T are the new tokens).

    ``window`` > 0: a sliding-window layer's window in tokens (<= 0: none). Keys older than the
    first query's window are cut off before SDPA (views), the rest masked per query.
    ``sinks``: float32 ``[H]`` attention sinks, or None (no sinks: the path is unchanged).
    """
    t, length = q.shape[0], k_ctx.shape[0]
    if 0 < window < length:
        return _windowed(q, k_ctx, v_ctx, scale, window, sinks)
    qh = q.transpose(0, 1).unsqueeze(0)  # [1, H, T, D]
    kh = k_ctx.transpose(0, 1).unsqueeze(0)
    vh = v_ctx.transpose(0, 1).unsqueeze(0)
    mask = None
    if length > t or sinks is not None:  # query i sits at position length - t + i (a sink: the mask made explicit)
        pos_q = torch.arange(length - t, length, device=q.device)[:, None]
        mask = (torch.arange(length, device=q.device)[None, :] <= pos_q)[None, None]
    if sinks is not None:
        return _sunk(qh.contiguous(), kh, vh, scale, mask, sinks)
    # Prompt lengths differ from call to call: keep to backends that do not re-plan per shape.
    out = grouped_sdpa(qh.contiguous(), kh, vh, scale, mask=mask, is_causal=mask is None, varying_shapes=True)
    return out.squeeze(0).transpose(0, 1)


def _sunk(qh: torch.Tensor, kh: torch.Tensor, vh: torch.Tensor, scale: float, mask: torch.Tensor,
          sinks: torch.Tensor) -> torch.Tensor:
    """``sink_sdpa`` of one sequence: qh ``[1, H, T, D]``, kh/vh ``[1, KVH, L, D]`` -> ``[T, H, D]``."""
    return sink_sdpa(qh, kh, vh, scale, mask, sinks, varying_shapes=True).squeeze(0).transpose(0, 1)


def _windowed(q: torch.Tensor, k_ctx: torch.Tensor, v_ctx: torch.Tensor, scale: float, window: int,
              sinks: torch.Tensor | None = None) -> torch.Tensor:
    """``prefill_attention`` of a window shorter than the context: query ``i`` at position
    ``p = L - T + i`` sees keys ``p - window < j <= p``."""
    t, length = q.shape[0], k_ctx.shape[0]
    first = max(0, length - t - window + 1)  # the first query's oldest key: none before it is read
    k_ctx, v_ctx = k_ctx[first:], v_ctx[first:]
    pos_q = torch.arange(length - t, length, device=q.device)[:, None]
    pos_k = torch.arange(first, length, device=q.device)[None, :]
    mask = ((pos_k <= pos_q) & (pos_k > pos_q - window))[None, None]
    if sinks is not None:
        return _sunk(q.transpose(0, 1).unsqueeze(0).contiguous(), k_ctx.transpose(0, 1).unsqueeze(0),
                     v_ctx.transpose(0, 1).unsqueeze(0), scale, mask, sinks)
    out = grouped_sdpa(q.transpose(0, 1).unsqueeze(0).contiguous(), k_ctx.transpose(0, 1).unsqueeze(0),
                       v_ctx.transpose(0, 1).unsqueeze(0), scale, mask=mask, varying_shapes=True)
    return out.squeeze(0).transpose(0, 1)
