"""Llama-family model code: config resolution, the torch model, weight filling."""

from harness.model.config import ARCHITECTURES, ModelConfig, RopeScaling
from harness.model.hf_config import read_hf_config, resolve_model_config, validate_model_config
from harness.model.llama import AttentionFn, LlamaModel
from harness.model.weights import build_model

__all__ = [
    "ARCHITECTURES",
    "AttentionFn",
    "LlamaModel",
    "ModelConfig",
    "RopeScaling",
    "build_model",
    "read_hf_config",
    "resolve_model_config",
    "validate_model_config",
]
