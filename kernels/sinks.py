"""Attention sinks (gpt-oss): one learned logit per query head that joins every softmax's denominator.

A layer with sinks attends as ``p_j = exp(s_j) / (sum_i exp(s_i) + exp(sink_h))``: a virtual key of
score ``sink_h`` and value 0 (transformers' gpt_oss ``eager_attention_forward``: a sink column cat to
the scores, dropped after the softmax). Every decode kernel and ``prefill_attention`` take it as
``sinks``: float32 ``[num_heads]`` on the kernel's device, or None (no sinks: the unchanged path).
"""

from __future__ import annotations

import torch

from kvbench.kernels.validate import KernelArgumentError


def check_sinks(sinks: torch.Tensor | None, num_heads: int, device: torch.device) -> None:
    """A kernel's ``sinks`` argument: None, or a contiguous float32 ``[num_heads]`` on ``device``."""
    if sinks is None:
        return
    if not isinstance(sinks, torch.Tensor):
        raise KernelArgumentError(f"sinks must be a float32 tensor [num_heads={num_heads}] or None, got {sinks!r}")
    if sinks.shape != (num_heads,) or sinks.dtype != torch.float32 or not sinks.is_contiguous():
        raise KernelArgumentError(f"sinks must be contiguous float32 [num_heads={num_heads}], got "
                                  f"{sinks.dtype} {tuple(sinks.shape)}")
    if sinks.device != device:
        raise KernelArgumentError(f"sinks is on {sinks.device} but q is on {device}")
