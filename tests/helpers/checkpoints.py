"""Random-weight Llama checkpoints in Hugging Face's format, in the shapes of kvbench's CPU model configs.

For runs that put kvbench next to another engine (transformers' ``generate``, vLLM's CPU build) on the
same weights: one folder with config.json and model.safetensors, written by ``LlamaForCausalLM``
itself. Weights are O(1), as in tests/helpers/models.py (HF's 0.02 init makes every logit ~0 and greedy
tokens near-ties), so every engine's greedy tokens are decided by clear margins.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from kvbench.harness.model.config import ModelConfig
from kvbench.harness.model.hf_config import resolve_model_config

# conf/model/<name>.yaml's shapes, as transformers.LlamaConfig keywords
SHAPES: dict[str, dict] = {
    "tiny-llama": dict(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=64),
    "llama-58m": dict(vocab_size=32000, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=4, head_dim=64),
}


def write_llama_checkpoint(folder: Path, shape: str = "tiny-llama", seed: int = 0) -> Path:
    """A random LlamaForCausalLM of ``shape`` saved into ``folder`` (fp32 safetensors); returns ``folder``."""
    import transformers

    config = transformers.LlamaConfig(**SHAPES[shape], rope_theta=10000.0, rms_norm_eps=1e-5,
                                      max_position_embeddings=4096, tie_word_embeddings=False,
                                      bos_token_id=1, eos_token_id=2, torch_dtype="float32")
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif "embed_tokens" in name:
                p.normal_(0.0, 1.0)
            else:
                p.normal_(0.0, p.shape[1] ** -0.5)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    return folder


def write_config(folder: Path, raw: dict[str, Any]) -> Path:
    """A model folder with only ``raw`` as its config.json (what scenarios that compute nothing need)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(raw))
    return folder


def read_config(folder: Path) -> ModelConfig:
    """``model.path=folder`` as kvbench reads it."""
    return resolve_model_config(ModelConfig(path=str(folder)))
