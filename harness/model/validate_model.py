"""The checks of a ``ModelConfig`` (named or read from a folder): each names the bad ``model.*`` key and what
is allowed."""

from __future__ import annotations

from kvbench.harness.errors import ConfigError
from kvbench.harness.model.config import (
    ARCHITECTURES,
    EXPERT_DTYPES,
    HIDDEN_ACTS,
    LAYER_TYPES,
    ROPE_TYPES,
    WEIGHT_SOURCES,
    ModelConfig,
)


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
        if rs.rope_type not in ROPE_TYPES:
            raise ConfigError(f"model.rope_scaling.rope_type={rs.rope_type!r}; allowed: {', '.join(ROPE_TYPES)} (or null)")
        if not rs.factor > 0 or rs.original_max_position_embeddings <= 0:
            raise ConfigError(
                "model.rope_scaling.factor and .original_max_position_embeddings must be positive"
            )
        if rs.rope_type == "llama3" and not rs.high_freq_factor > rs.low_freq_factor > 0:
            raise ConfigError(
                "model.rope_scaling needs high_freq_factor > low_freq_factor > 0, got "
                f"{rs.high_freq_factor} and {rs.low_freq_factor}"
            )
    validate_family_fields(cfg)


def validate_family_fields(cfg: ModelConfig) -> None:
    """The keys beyond the Llama shape: layer kinds and window, experts, activation, Gemma's and gpt-oss's."""
    if cfg.layer_types is not None:
        if len(cfg.layer_types) != cfg.num_layers:
            raise ConfigError(f"model.layer_types lists {len(cfg.layer_types)} layers; model.num_layers="
                              f"{cfg.num_layers} (one kind per layer, or null: every layer full_attention)")
        for i, kind in enumerate(cfg.layer_types):
            if kind not in LAYER_TYPES:
                raise ConfigError(f"model.layer_types[{i}]={kind!r}: layer {i}'s attention kind is not supported; "
                                  f"allowed: {', '.join(LAYER_TYPES)}")
    sliding = cfg.layer_types is not None and "sliding_attention" in cfg.layer_types
    if sliding and (not isinstance(cfg.sliding_window, int) or cfg.sliding_window < 1):
        raise ConfigError(f"model.sliding_window={cfg.sliding_window!r} must be a positive number of tokens "
                          "(model.layer_types has sliding_attention layers)")
    if not sliding and cfg.sliding_window is not None:
        raise ConfigError(f"model.sliding_window={cfg.sliding_window} needs sliding_attention layers in "
                          "model.layer_types; set it null")
    if cfg.hidden_act not in HIDDEN_ACTS:
        raise ConfigError(f"model.hidden_act={cfg.hidden_act!r}; allowed: {', '.join(HIDDEN_ACTS)}")
    if cfg.expert_dtype not in EXPERT_DTYPES:
        raise ConfigError(f"model.expert_dtype={cfg.expert_dtype!r}; allowed: {', '.join(EXPERT_DTYPES)}")
    if cfg.num_experts < 0:
        raise ConfigError(f"model.num_experts={cfg.num_experts} must be >= 0 (0: a dense MLP)")
    if cfg.num_experts:
        if not 1 <= cfg.num_experts_per_tok <= cfg.num_experts:
            raise ConfigError(f"model.num_experts_per_tok={cfg.num_experts_per_tok} must be in [1, "
                              f"model.num_experts={cfg.num_experts}]")
        if cfg.moe_intermediate_size < 1:
            raise ConfigError(f"model.moe_intermediate_size={cfg.moe_intermediate_size} must be a positive integer")
    elif cfg.num_experts_per_tok or cfg.moe_intermediate_size or cfg.expert_dtype != "dtype":
        raise ConfigError("model.num_experts_per_tok, model.moe_intermediate_size and model.expert_dtype need "
                          "model.num_experts > 0 (a mixture of experts); leave them 0, 0 and dtype")
    for key in ("swiglu_limit", "query_pre_attn_scalar", "rope_local_theta", "attn_logit_softcapping",
                "final_logit_softcapping"):
        value = getattr(cfg, key)
        if value is not None and not value > 0:
            raise ConfigError(f"model.{key}={value} must be positive (or null)")
