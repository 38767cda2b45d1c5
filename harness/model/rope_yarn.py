"""YaRN RoPE scaling (gpt-oss), as transformers' ``_compute_yarn_parameters`` computes it.

YaRN stretches the slow rotations by ``factor`` (interpolation), keeps the fast ones (extrapolation), and ramps
linearly between them over the dimensions whose rotation count over the original context lies between
``beta_slow`` and ``beta_fast``. It also scales cos and sin by an attention factor, ``0.1 ln(factor) + 1``: every
attention score grows by its square, which sharpens the softmax as the context grows. The inverse frequencies are
computed on the CPU in float32, in transformers' operation order, so they match it bit for bit.
"""

from __future__ import annotations

import math

import torch

from kvbench.harness.model.config import RopeScaling


def yarn_attention_factor(scaling: RopeScaling) -> float:
    """The factor on cos and sin (transformers' ``yarn_get_mscale(factor)``; no mscale keys: gpt-oss has none)."""
    return 1.0 if scaling.factor <= 1 else 0.1 * math.log(scaling.factor) + 1.0


def _correction_dim(rotations: float, head_dim: int, theta: float, positions: int) -> float:
    """The dimension whose frequency turns ``rotations`` times over ``positions`` tokens (not rounded)."""
    return (head_dim * math.log(positions / (rotations * 2 * math.pi))) / (2 * math.log(theta))


def correction_range(head_dim: int, theta: float, scaling: RopeScaling) -> tuple[float, float]:
    """The first and last dimension pair of the ramp: beta_fast's and beta_slow's dimensions, rounded outwards
    when ``truncate`` (transformers' default; gpt-oss's config turns it off), clipped to ``[0, head_dim - 1]``."""
    context = scaling.original_max_position_embeddings
    low = _correction_dim(scaling.beta_fast, head_dim, theta, context)
    high = _correction_dim(scaling.beta_slow, head_dim, theta, context)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, head_dim - 1)


def yarn_inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """fp32 ``[head_dim // 2]`` inverse frequencies: interpolated below the ramp, extrapolated above it."""
    if scaling.rope_type != "yarn":
        raise ValueError(f"yarn_inverse_frequencies needs rope_type 'yarn', got {scaling.rope_type!r}")
    pos_freqs = theta ** (torch.arange(0, head_dim, 2).to(dtype=torch.float) / head_dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (scaling.factor * pos_freqs)
    low, high = correction_range(head_dim, theta, scaling)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolated = 1 - ramp  # the share of each pair that keeps its original frequency
    return interpolation * (1 - extrapolated) + extrapolation * extrapolated
