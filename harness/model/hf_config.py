"""Turn the ``model`` config group into a validated ``ModelConfig``.

A named YAML already holds the shape; ``model.path`` replaces it with the shape
read from a Hugging Face folder's ``config.json`` (both the ``rope_theta`` +
``rope_scaling`` layout of published checkpoints and the ``rope_parameters``
layout that transformers 5.x writes). The keys every family shares are read here,
each family's own (windows, experts, Gemma's and gpt-oss's details) in
harness/model/hf_families.py; the checks are harness/model/validate_model.py's.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from kvbench.harness.errors import ConfigError, finite_number, whole_number
from kvbench.harness.model.config import ModelConfig, RopeScaling
from kvbench.harness.model.hf_families import (
    DEFAULT_ROPE_KINDS,
    DEFAULTS,
    MODEL_TYPES,
    ROPE_KINDS,
    family_fields,
    flatten,
)
from kvbench.harness.model.validate_model import validate_model_config

# A shape figure of config.json: a whole number up to int32's range (the kernels index with int32).
MAX_SIZE = 2**31 - 1
REQUIRED_FIELDS = ("hidden_size", "num_attention_heads", "vocab_size", "intermediate_size", "num_hidden_layers")
# transformers' per-architecture defaults for max_position_embeddings (the others: hf_families.DEFAULTS).
_DEFAULT_MAX_POSITIONS = {"llama": 2048, "mistral": 4096 * 32, "qwen2": 32768}


def resolve_model_config(cfg: Any) -> ModelConfig:
    """The validated shape to build: ``cfg`` itself, or read from ``cfg.path``."""
    cfg = _as_model_config(cfg)
    if cfg.path:
        cfg = read_hf_config(cfg.path)
    validate_model_config(cfg)
    return cfg


def _as_model_config(cfg: Any) -> ModelConfig:
    """Accept a Hydra DictConfig or a ModelConfig whose rope_scaling is a plain dict."""
    if not isinstance(cfg, ModelConfig):
        cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), cfg))
    if isinstance(cfg.rope_scaling, dict):
        cfg = dataclasses.replace(cfg, rope_scaling=RopeScaling(**cfg.rope_scaling))
    return cfg


def read_hf_config(path: str) -> ModelConfig:
    """Map ``PATH/config.json`` (any model_type of ``MODEL_TYPES``) onto ``ModelConfig``."""
    folder = Path(path).expanduser()
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"model.path={path} has no config.json")
    try:
        raw = json.loads(config_file.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"model.path={path}: config.json is unreadable ({err})".splitlines()[0]) from err
    if not isinstance(raw, dict):
        raise ConfigError(f"model.path={path}: config.json holds {type(raw).__name__}, not an object of keys")

    model_type = raw.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ConfigError(
            f"model.path={path}: model_type {model_type!r} is not supported; "
            f"allowed: {', '.join(MODEL_TYPES)}"
        )
    arch = MODEL_TYPES[model_type]
    raw = {**DEFAULTS[arch], **flatten(raw, path)}
    if arch != "gemma3_text" and raw.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"model.path={path}: hidden_act {raw['hidden_act']!r} unsupported (silu only)")
    if raw.get("mlp_bias", False):
        raise ConfigError(f"model.path={path}: mlp_bias=true is unsupported")

    missing = [k for k in REQUIRED_FIELDS if k not in raw]
    if missing:
        raise ConfigError(f"model.path={path}: config.json lacks {missing[0]!r}")
    size = lambda key, value: whole_number(value, f"model.path={path}: config.json {key}", 1, MAX_SIZE)  # noqa: E731
    hidden = size("hidden_size", raw["hidden_size"])
    heads = size("num_attention_heads", raw["num_attention_heads"])
    fields = dict(
        vocab_size=size("vocab_size", raw["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=size("intermediate_size", raw["intermediate_size"]),
        num_layers=size("num_hidden_layers", raw["num_hidden_layers"]),
        num_heads=heads,
    )
    theta, scaling = _rope(raw, path, ROPE_KINDS.get(arch, DEFAULT_ROPE_KINDS))
    shared = dict(
        name=folder.resolve().name,
        architecture=arch,
        num_kv_heads=size("num_key_value_heads", _or(raw, "num_key_value_heads", heads)),
        # Qwen2 has no head_dim key; some Llama files carry head_dim: null.
        head_dim=size("head_dim", _or(raw, "head_dim", hidden // heads)),
        rope_theta=theta,
        rope_scaling=scaling,
        rms_norm_eps=finite_number(raw.get("rms_norm_eps", 1e-6), f"model.path={path}: config.json rms_norm_eps", 0),
        # Qwen2 always biases q/k/v; Mistral never does (HF ignores attention_bias there); the others bias
        # q/k/v/o with attention_bias.
        qkv_bias=arch == "qwen2" or (arch != "mistral" and _flag(raw, "attention_bias", path)),
        tie_word_embeddings=_flag(raw, "tie_word_embeddings", path),
        max_position_embeddings=size("max_position_embeddings",
                                     _or(raw, "max_position_embeddings", _DEFAULT_MAX_POSITIONS.get(arch, 32768))),
        weights="path",
        path=str(path),
        **fields,
    )
    # A family's reader may replace a shared key as transformers derives it (DeepSeek's head_dim).
    return ModelConfig(**{**shared, **family_fields(arch, raw, fields["num_layers"], path)})


def _or(raw: dict[str, Any], key: str, default: Any) -> Any:
    """``raw[key]``, or ``default`` when the key is absent or null (HF writes ``head_dim: null``)."""
    value = raw.get(key)
    return default if value is None else value


def _flag(raw: dict[str, Any], key: str, path: str) -> bool:
    value = raw.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(f"model.path={path}: config.json {key}={value!r} must be true or false")
    return value


def _rope(raw: dict[str, Any], path: str, kinds: tuple[str, ...]) -> tuple[float, RopeScaling | None]:
    # transformers 5.x: rope_parameters {rope_theta, rope_type, ...} (Gemma 3: one such per layer kind, the
    # full-attention layers' here); older files: top-level rope_theta + rope_scaling {type|rope_type, ...}.
    params: dict[str, Any] = dict(raw.get("rope_scaling") or {})
    layered = raw.get("rope_parameters") or {}
    params.update(layered.get("full_attention") or {} if "full_attention" in layered else layered)
    theta = finite_number(params.get("rope_theta", raw.get("rope_theta", 10000.0)),
                          f"model.path={path}: config.json rope_theta", 0)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind not in kinds:
        raise ConfigError(f"model.path={path}: rope type {kind!r} unsupported; allowed: {', '.join(kinds)}")
    required = {"llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
                "linear": ("factor",), "yarn": ("factor", "original_max_position_embeddings")}[kind]
    lacks = [k for k in required if k not in params]
    if lacks:
        raise ConfigError(f"model.path={path}: {kind} rope scaling lacks {lacks[0]!r}")
    what = f"model.path={path}: config.json rope scaling"
    number = lambda key, default: finite_number(params.get(key, default), f"{what} {key}", 0)  # noqa: E731
    scaling = RopeScaling(rope_type=kind, factor=number("factor", None))
    if kind == "llama3":
        scaling.low_freq_factor = number("low_freq_factor", None)
        scaling.high_freq_factor = number("high_freq_factor", None)
    if kind == "yarn":  # transformers' yarn defaults
        scaling.beta_fast, scaling.beta_slow = number("beta_fast", 32.0), number("beta_slow", 1.0)
        scaling.truncate = _flag({"truncate": params.get("truncate", True)}, "truncate", path)
    if kind in ("llama3", "yarn"):
        scaling.original_max_position_embeddings = whole_number(
            params["original_max_position_embeddings"], f"{what} original_max_position_embeddings", 1, MAX_SIZE)
    return theta, scaling
