"""Rotary position embedding, bit-for-bit the Hugging Face Llama convention.

Rotate-half layout (pairs are ``(i, i + head_dim/2)``, not interleaved), and the
Llama-3.1 ``llama3`` frequency scaling exactly as ``transformers`` computes it.
"""

from __future__ import annotations

import math

import torch

from kvbench.harness.model.config import RopeScaling
from kvbench.harness.model.rope_yarn import yarn_attention_factor, yarn_inverse_frequencies


def inverse_frequencies(
    head_dim: int, theta: float, scaling: RopeScaling | None
) -> torch.Tensor:
    """fp32 ``[head_dim // 2]`` inverse frequencies, computed on the CPU.

    Always on the CPU so every device starts from the same bits; the formula and
    operation order copy ``transformers.modeling_rope_utils`` (default / llama3).
    """
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float) / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "yarn":  # gpt-oss (harness/model/rope_yarn.py)
        return yarn_inverse_frequencies(head_dim, theta, scaling)
    if scaling.rope_type == "linear":  # Gemma 3's full layers: every frequency divided by factor (transformers' /=)
        return inv_freq / scaling.factor
    if scaling.rope_type != "llama3":
        raise ValueError(f"unsupported rope_type {scaling.rope_type!r}")
    factor = scaling.factor
    low, high = scaling.low_freq_factor, scaling.high_freq_factor
    old_context = scaling.original_max_position_embeddings
    low_freq_wavelen = old_context / low
    high_freq_wavelen = old_context / high
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths are stretched by ``factor``, short ones kept, the band
    # in between interpolated smoothly.
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(torch.nn.Module):
    """cos/sin for a flat batch of positions.

    No cached cos/sin table: computing ``positions x inv_freq`` costs O(T * head_dim)
    once per forward (shared by every layer), needs no host sync to decide when a
    table must grow (``positions.max().item()`` would stall every decode step and
    break CUDA-graph capture), and never allocates 128k-row tables. It is also the
    exact arithmetic HF performs, so results match it bit for bit.
    """

    inv_freq: torch.Tensor

    def __init__(
        self,
        head_dim: int,
        theta: float,
        scaling: RopeScaling | None,
        device: torch.device | str,
    ) -> None:
        super().__init__()
        inv_freq = inverse_frequencies(head_dim, theta, scaling).to(device)
        # Non-persistent: derived from the config, not part of any checkpoint.
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        # yarn scales cos and sin (transformers' attention_scaling); 1.0 skips the multiply.
        self.attention_factor = yarn_attention_factor(scaling) if scaling and scaling.rope_type == "yarn" else 1.0

    def forward(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``positions [T]`` -> ``(cos, sin)``, each ``[T, head_dim]`` in ``dtype``."""
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if self.attention_factor != 1.0:  # in float32, before the cast, as transformers does
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos.to(dtype), sin.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x [T, heads, head_dim]`` rotated by per-token ``cos``/``sin [T, head_dim]``."""
    cos, sin = cos[:, None, :], sin[:, None, :]
    return x * cos + rotate_half(x) * sin
