"""What each model family's ``config.json`` adds to the Llama shape, derived as transformers derives it.

harness/model/hf_config.py reads the keys every family shares; this module reads the rest: sliding windows
(``layer_types``), q/k norms, mixtures of experts, Gemma 3's attention and RoPE details, gpt-oss's sinks and
clamped SwiGLU. Each reader mirrors transformers 5.x's ``configuration_<family>.py`` ``__post_init__``.
"""

from __future__ import annotations

from typing import Any, Callable

from kvbench.harness.errors import ConfigError, finite_number, whole_number
from kvbench.harness.model import hf_latent
from kvbench.harness.model.config import LAYER_TYPES

# config.json's model_type -> ModelConfig.architecture. A Gemma 3 checkpoint with a vision tower ("gemma3")
# nests its language model under text_config; kvbench models that language model.
MODEL_TYPES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3",
               "qwen3_moe": "qwen3_moe", "gemma3": "gemma3_text", "gemma3_text": "gemma3_text", "gpt_oss": "gpt_oss",
               **hf_latent.MODEL_TYPES}  # DeepSeek-V2/V3, Kimi-K2, Qwen3-Next: harness/model/hf_latent.py

# transformers' class defaults for the keys a published config.json of the family omits (Gemma 3's
# text_config leaves out its vocabulary and RoPE bases, gpt-oss its head_dim ...).
DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {},
    "mistral": {"sliding_window": 4096},
    "qwen2": {},
    "qwen3": {"head_dim": 128},
    "qwen3_moe": {},
    "gemma3_text": {"vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                    "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
                    "query_pre_attn_scalar": 256, "sliding_window": 4096, "rope_theta": 1_000_000.0,
                    "rope_local_base_freq": 10_000.0},
    "gpt_oss": {"head_dim": 64, "sliding_window": 128, "rms_norm_eps": 1e-5, "attention_bias": True,
                "num_experts_per_tok": 4, "swiglu_limit": 7.0, "max_position_embeddings": 131_072},
    **hf_latent.DEFAULTS,
}
# The RoPE scalings each family ships (others are refused when read).
ROPE_KINDS = {"gemma3_text": ("default", "linear"), "gpt_oss": ("default", "yarn"), **hf_latent.ROPE_KINDS}
DEFAULT_ROPE_KINDS = ("default", "llama3")

Fields = dict[str, Any]


def flatten(raw: dict[str, Any], path: str) -> dict[str, Any]:
    """The language model's keys: a ``gemma3`` file's ``text_config``; any other file as it is."""
    if raw.get("model_type") != "gemma3":
        return raw
    text = raw.get("text_config") or {}
    if not isinstance(text, dict):
        raise ConfigError(f"model.path={path}: config.json text_config must be an object of keys")
    # Gemma3Config ties the embeddings at its top level (default true).
    return {"tie_word_embeddings": raw.get("tie_word_embeddings", True), **text, "model_type": "gemma3"}


def family_fields(arch: str, raw: dict[str, Any], num_layers: int, path: str) -> Fields:
    """The ModelConfig fields beyond the Llama shape that ``raw`` (defaults applied) sets for ``arch``."""
    return _READERS[arch](raw, num_layers, f"model.path={path}: config.json")


def _windowed_above(raw: dict[str, Any], num_layers: int, what: str) -> Fields:
    """Qwen2 / Qwen3: with use_sliding_window, the layers from max_window_layers on slide."""
    window = raw.get("sliding_window", 4096) if _flag(raw, "use_sliding_window", what) else None
    first = whole_number(raw.get("max_window_layers", 28), f"{what} max_window_layers", 0)
    derived = None if window is None else ["sliding_attention" if i >= first else "full_attention"
                                           for i in range(num_layers)]
    return _layers(raw, num_layers, window, derived, what)


def _llama(raw: dict[str, Any], num_layers: int, what: str) -> Fields:
    return {}


def _mistral(raw: dict[str, Any], num_layers: int, what: str) -> Fields:
    # MistralModel's mask slides on every layer whenever sliding_window is set (null: v0.2 on, no window).
    window = raw.get("sliding_window")
    return _layers({}, num_layers, window, None if window is None else ["sliding_attention"] * num_layers, what)


def _qwen2(raw: dict[str, Any], num_layers: int, what: str) -> Fields:
    return _windowed_above(raw, num_layers, what)


def _qwen3(raw: dict[str, Any], num_layers: int, what: str) -> Fields:
    return {**_windowed_above(raw, num_layers, what), "qk_norm": True}


def _qwen3_moe(raw: dict[str, Any], num_layers: int, what: str) -> Fields:
    # Qwen3MoeModel's mask slides on every layer when use_sliding_window is on.
    window = raw.get("sliding_window", 4096) if _flag(raw, "use_sliding_window", what) else None
    # A layer is sparse unless listed in mlp_only_layers or skipped by decoder_sparse_step; kvbench models
    # the published layout, every layer sparse.
    if raw.get("mlp_only_layers") or raw.get("decoder_sparse_step", 1) != 1:
        raise ConfigError(f"{what} mlp_only_layers={raw.get('mlp_only_layers')!r} decoder_sparse_step="
                          f"{raw.get('decoder_sparse_step', 1)!r}: dense layers among sparse ones are not "
                          "supported; allowed: mlp_only_layers [] and decoder_sparse_step 1")
    return {**_layers({}, num_layers, window, None if window is None else ["sliding_attention"] * num_layers, what),
            "qk_norm": True, **_experts(raw, _experts_key(raw), 128, 8, raw.get("moe_intermediate_size", 768), what),
            "norm_topk_prob": _flag(raw, "norm_topk_prob", what)}


def _gemma3(raw: dict[str, Any], num_layers: int, what: str) -> Fields:
    if raw.get("use_bidirectional_attention"):
        raise ConfigError(f"{what} use_bidirectional_attention=true is not supported; allowed: false (causal)")
    # transformers 5 keeps the pattern as _sliding_window_pattern (a saved file has layer_types as well)
    pattern = whole_number(raw.get("sliding_window_pattern", raw.get("_sliding_window_pattern", 6)),
                           f"{what} sliding_window_pattern", 1)
    derived = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)]
    act = raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"
    if act != "gelu_pytorch_tanh":
        raise ConfigError(f"{what} hidden_activation={act!r} is not supported; allowed: gelu_pytorch_tanh")
    params = raw.get("rope_parameters") or {}
    sliding = params.get("sliding_attention") or {}
    # transformers scales the sliding layers' RoPE only if this file says so; every Gemma 3 leaves them unscaled
    if sliding.get("rope_type", "default") != "default":
        raise ConfigError(f"{what} rope_parameters.sliding_attention.rope_type={sliding['rope_type']!r} is not "
                          "supported; allowed: default (the sliding layers' RoPE unscaled)")
    local = sliding.get("rope_theta", raw.get("rope_local_base_freq"))
    return {**_layers(raw, num_layers, raw["sliding_window"], derived, what), "qk_norm": True,
            "hidden_act": "gelu_pytorch_tanh",
            "query_pre_attn_scalar": finite_number(raw["query_pre_attn_scalar"], f"{what} query_pre_attn_scalar", 0),
            "rope_local_theta": finite_number(local, f"{what} rope_local_base_freq", 0),
            "attn_logit_softcapping": _optional_positive(raw, "attn_logit_softcapping", what),
            "final_logit_softcapping": _optional_positive(raw, "final_logit_softcapping", what)}


def _gpt_oss(raw: dict[str, Any], num_layers: int, what: str) -> Fields:
    derived = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(num_layers)]
    quant = raw.get("quantization_config") or {}
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    if method not in (None, "mxfp4"):
        raise ConfigError(f"{what} quantization_config.quant_method={method!r} is not supported; allowed: mxfp4")
    return {**_layers(raw, num_layers, raw["sliding_window"], derived, what), "attention_sinks": True,
            # GptOssTopKRouter: softmax over the top-k logits, i.e. the chosen experts' weights sum to 1.
            "norm_topk_prob": True,
            **_experts(raw, _experts_key(raw), 128, 4, raw["intermediate_size"], what),
            "expert_dtype": "mxfp4" if method == "mxfp4" else "dtype",
            "swiglu_limit": finite_number(raw["swiglu_limit"], f"{what} swiglu_limit", 0)}


def _experts_key(raw: dict[str, Any]) -> str:
    """Published files say num_experts (Qwen3-MoE) or num_local_experts (gpt-oss); transformers 5 writes the
    latter for both (its attribute_map aliases them)."""
    return "num_local_experts" if "num_local_experts" in raw else "num_experts"


def _experts(raw: dict[str, Any], key: str, experts: int, per_token: int, size: Any, what: str) -> Fields:
    count = whole_number(raw.get(key, experts), f"{what} {key}", 1)
    return {"num_experts": count,
            "num_experts_per_tok": whole_number(raw.get("num_experts_per_tok", per_token),
                                                f"{what} num_experts_per_tok", 1, count),
            "moe_intermediate_size": whole_number(size, f"{what} moe_intermediate_size", 1)}


def _layers(raw: dict[str, Any], num_layers: int, window: Any, derived: list[str] | None, what: str) -> Fields:
    """``layer_types`` (config.json's own list, else ``derived``) and the window; every layer full -> None."""
    kinds = raw.get("layer_types") or derived
    if kinds is None:
        return {"layer_types": None, "sliding_window": None}
    if not isinstance(kinds, list) or len(kinds) != num_layers:
        raise ConfigError(f"{what} layer_types must list one kind per layer ({num_layers}), got {kinds!r}")
    for i, kind in enumerate(kinds):
        if kind not in LAYER_TYPES:
            raise ConfigError(f"{what} layer_types[{i}]={kind!r}: layer {i}'s attention kind is not supported; "
                              f"allowed: {', '.join(LAYER_TYPES)}")
    if "sliding_attention" not in kinds:
        return {"layer_types": None, "sliding_window": None}
    if window is None:
        raise ConfigError(f"{what} has sliding_attention layers but sliding_window is null; set it (tokens)")
    return {"layer_types": list(kinds), "sliding_window": whole_number(window, f"{what} sliding_window", 1)}


def _flag(raw: dict[str, Any], key: str, what: str) -> bool:
    value = raw.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(f"{what} {key}={value!r} must be true or false")
    return value


def _optional_positive(raw: dict[str, Any], key: str, what: str) -> float | None:
    value = raw.get(key)
    return None if value is None else finite_number(value, f"{what} {key}", 0)


_READERS: dict[str, Callable[[dict[str, Any], int, str], Fields]] = {
    "llama": _llama, "mistral": _mistral, "qwen2": _qwen2, "qwen3": _qwen3, "qwen3_moe": _qwen3_moe,
    "gemma3_text": _gemma3, "gpt_oss": _gpt_oss, **hf_latent.READERS}
