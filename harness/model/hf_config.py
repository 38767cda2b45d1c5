"""Turn the ``model`` config group into a validated ``ModelConfig``.

A named YAML already holds the shape; ``model.path`` replaces it with the shape
read from a Hugging Face folder's ``config.json`` (both the ``rope_theta`` +
``rope_scaling`` layout of published checkpoints and the ``rope_parameters``
layout that transformers 5.x writes).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from harness.errors import ConfigError, finite_number, whole_number
from harness.model.config import ARCHITECTURES, WEIGHT_SOURCES, ModelConfig, RopeScaling

# transformers' per-architecture defaults for keys a config.json may omit.
# A shape figure of config.json: a whole number up to int32's range (the kernels index with int32).
MAX_SIZE = 2**31 - 1
REQUIRED_FIELDS = ("hidden_size", "num_attention_heads", "vocab_size", "intermediate_size", "num_hidden_layers")
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
    """Map ``PATH/config.json`` (llama / mistral / qwen2) onto ``ModelConfig``."""
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

    arch = raw.get("model_type")
    if arch not in ARCHITECTURES:
        raise ConfigError(
            f"model.path={path}: model_type {arch!r} is not supported; "
            f"allowed: {', '.join(ARCHITECTURES)}"
        )
    if raw.get("hidden_act", "silu") != "silu":
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
    theta, scaling = _rope(raw, path)
    return ModelConfig(
        name=folder.resolve().name,
        architecture=arch,
        num_kv_heads=size("num_key_value_heads", _or(raw, "num_key_value_heads", heads)),
        # Qwen2 has no head_dim key; some Llama files carry head_dim: null.
        head_dim=size("head_dim", _or(raw, "head_dim", hidden // heads)),
        rope_theta=theta,
        rope_scaling=scaling,
        rms_norm_eps=finite_number(raw.get("rms_norm_eps", 1e-6), f"model.path={path}: config.json rms_norm_eps", 0),
        # Qwen2 always biases q/k/v; Mistral never does (HF ignores attention_bias there).
        qkv_bias=arch == "qwen2" or (arch == "llama" and _flag(raw, "attention_bias", path)),
        tie_word_embeddings=_flag(raw, "tie_word_embeddings", path),
        max_position_embeddings=size("max_position_embeddings",
                                     _or(raw, "max_position_embeddings", _DEFAULT_MAX_POSITIONS[arch])),
        weights="path",
        path=str(path),
        **fields,
    )


def _or(raw: dict[str, Any], key: str, default: Any) -> Any:
    """``raw[key]``, or ``default`` when the key is absent or null (HF writes ``head_dim: null``)."""
    value = raw.get(key)
    return default if value is None else value


def _flag(raw: dict[str, Any], key: str, path: str) -> bool:
    value = raw.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(f"model.path={path}: config.json {key}={value!r} must be true or false")
    return value


def _rope(raw: dict[str, Any], path: str) -> tuple[float, RopeScaling | None]:
    # transformers 5.x: rope_parameters {rope_theta, rope_type, ...};
    # older files: top-level rope_theta + rope_scaling {type|rope_type, ...}.
    params: dict[str, Any] = dict(raw.get("rope_scaling") or {})
    params.update(raw.get("rope_parameters") or {})
    theta = finite_number(params.get("rope_theta", raw.get("rope_theta", 10000.0)),
                          f"model.path={path}: config.json rope_theta", 0)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise ConfigError(f"model.path={path}: rope type {kind!r} unsupported; allowed: default, llama3")
    lacks = [k for k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
             if k not in params]
    if lacks:
        raise ConfigError(f"model.path={path}: llama3 rope scaling lacks {lacks[0]!r}")
    what = f"model.path={path}: config.json rope scaling"
    scaling = RopeScaling(
        rope_type="llama3",
        factor=finite_number(params["factor"], f"{what} factor", 0),
        low_freq_factor=finite_number(params["low_freq_factor"], f"{what} low_freq_factor", 0),
        high_freq_factor=finite_number(params["high_freq_factor"], f"{what} high_freq_factor", 0),
        original_max_position_embeddings=whole_number(params["original_max_position_embeddings"],
                                                      f"{what} original_max_position_embeddings", 1, MAX_SIZE),
    )
    return theta, scaling


def validate_model_config(cfg: ModelConfig) -> None:
    """Raise ConfigError naming the first bad ``model.*`` key."""
    if cfg.architecture not in ARCHITECTURES:
        raise ConfigError(
            f"model.architecture={cfg.architecture!r} is not supported; allowed: {', '.join(ARCHITECTURES)}"
        )
    if cfg.weights not in WEIGHT_SOURCES:
        raise ConfigError(f"model.weights={cfg.weights!r}; allowed: {', '.join(WEIGHT_SOURCES)}")
    if cfg.weights == "path" and not cfg.path:
        raise ConfigError("model.weights=path needs model.path (a Hugging Face folder)")
    for key in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_layers",
        "num_heads",
        "num_kv_heads",
        "head_dim",
        "max_position_embeddings",
    ):
        value = getattr(cfg, key)
        if not isinstance(value, int) or value <= 0:
            raise ConfigError(f"model.{key}={value!r} must be a positive integer")
    if cfg.num_heads % cfg.num_kv_heads:
        raise ConfigError(
            f"model.num_kv_heads={cfg.num_kv_heads} must divide model.num_heads={cfg.num_heads}"
        )
    if cfg.head_dim % 2:
        raise ConfigError(f"model.head_dim={cfg.head_dim} must be even (RoPE rotates pairs)")
    if not cfg.rope_theta > 0:
        raise ConfigError(f"model.rope_theta={cfg.rope_theta} must be positive")
    if not cfg.rms_norm_eps > 0:
        raise ConfigError(f"model.rms_norm_eps={cfg.rms_norm_eps} must be positive")
    rs = cfg.rope_scaling
    if rs is not None:
        if rs.rope_type != "llama3":
            raise ConfigError(f"model.rope_scaling.rope_type={rs.rope_type!r}; allowed: llama3 (or null)")
        if not rs.factor > 0 or rs.original_max_position_embeddings <= 0:
            raise ConfigError(
                "model.rope_scaling.factor and .original_max_position_embeddings must be positive"
            )
        if not rs.high_freq_factor > rs.low_freq_factor > 0:
            raise ConfigError(
                "model.rope_scaling needs high_freq_factor > low_freq_factor > 0, got "
                f"{rs.high_freq_factor} and {rs.low_freq_factor}"
            )
