"""The model config group's schema: a Llama-family shape, by name or from a HF folder.

Fields mirror Hugging Face ``config.json`` so a named YAML in conf/model/ and a
local checkpoint folder produce the same object.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

ARCHITECTURES = ("llama", "mistral", "qwen2")
WEIGHT_SOURCES = ("dummy", "path")


@dataclass
class RopeScaling:
    """Llama-3.1 style frequency-dependent RoPE scaling (``rope_type: llama3``)."""

    rope_type: str = "llama3"
    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass
class ModelConfig:
    name: str = "tiny-llama"
    architecture: str = "llama"
    # Defaults are tiny-llama's shape (conf/model/tiny-llama.yaml).
    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 768
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    rope_theta: float = 10000.0
    rope_scaling: Optional[RopeScaling] = None
    rms_norm_eps: float = 1e-5
    qkv_bias: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096
    # "dummy": seeded random weights; "path": safetensors from ``path``.
    weights: str = "dummy"
    # Local Hugging Face folder (config.json + *.safetensors). Setting it
    # replaces the shape above with the folder's config.json.
    path: Optional[str] = None

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim
