"""The ``config.json`` readers of the families whose caches are not K and V per head: DeepSeek-V2/V3 and Kimi-K2
(multi-head latent attention) and Qwen3-Next (linear attention with a fixed state beside gated full attention).

Each mirrors transformers 5's ``configuration_<family>.py``: its class defaults for the keys a file omits
(``DEFAULTS``), and its ``__post_init__``: DeepSeek's ``head_dim`` is ``qk_rope_head_dim`` (the rotary part:
MLA's per-head K is ``qk_nope_head_dim + qk_rope_head_dim`` and its V ``v_head_dim``, all read here), a null
``q_lora_rank`` (DeepSeek-V2-Lite) projects the queries in one matrix; Qwen3-Next's ``layer_types`` default to
three ``linear_attention`` layers before each ``full_attention`` one (``full_attention_interval``, 4).
Kimi-K2's files say ``model_type: kimi_k2`` and load as DeepSeek-V3 (``DeepseekV3ForCausalLM``, the same
configuration class). DeepSeek-V2/V3 (and Kimi-K2) are computed by harness/model/deepseek.py; Qwen3-Next (with its
``partial_rotary_factor``, read here) by harness/model/qwen3_next.py.
harness/model/hf_families.py merges ``MODEL_TYPES``, ``DEFAULTS``, ``ROPE_KINDS`` and ``READERS`` into its own.
"""

from __future__ import annotations

from typing import Any, Callable

from kvbench.harness.errors import ConfigError, finite_number, whole_number
from kvbench.harness.model.config import RopeScaling

Fields = dict[str, Any]

MODEL_TYPES = {"deepseek_v2": "deepseek_v2", "deepseek_v3": "deepseek_v3", "kimi_k2": "deepseek_v3",
               "qwen3_next": "qwen3_next"}

# transformers 5.25's class defaults (DeepseekV2Config, DeepseekV3Config, Qwen3NextConfig) for the keys the
# readers need and a file may omit.
DEFAULTS: dict[str, dict[str, Any]] = {
    "deepseek_v2": {"vocab_size": 102_400, "hidden_size": 4096, "intermediate_size": 11_008, "num_hidden_layers": 32,
                    "num_attention_heads": 32, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
                    "first_k_dense_replace": 0, "kv_lora_rank": 512, "q_lora_rank": 1536, "n_routed_experts": 64,
                    "n_shared_experts": 2, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
                    "moe_intermediate_size": 1407, "norm_topk_prob": False},
    "deepseek_v3": {"vocab_size": 129_280, "hidden_size": 7168, "intermediate_size": 18_432, "num_hidden_layers": 61,
                    "num_attention_heads": 128, "num_key_value_heads": 128, "max_position_embeddings": 4096,
                    "rms_norm_eps": 1e-6, "first_k_dense_replace": 3, "kv_lora_rank": 512, "q_lora_rank": 1536,
                    "n_routed_experts": 256, "n_shared_experts": 1, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                    "v_head_dim": 128, "moe_intermediate_size": 2048, "num_experts_per_tok": 8,
                    "norm_topk_prob": True, "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5},
    "qwen3_next": {"vocab_size": 151_936, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 48,
                   "num_attention_heads": 16, "num_key_value_heads": 2, "max_position_embeddings": 32_768,
                   "rms_norm_eps": 1e-6, "head_dim": 256, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
                   "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
                   "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "num_experts_per_tok": 10,
                   "num_experts": 512, "norm_topk_prob": True, "full_attention_interval": 4},
}
# DeepSeek-V2/V3 and Kimi-K2 ship yarn RoPE with mscale (harness/model/deepseek.py computes it).
ROPE_KINDS = {"deepseek_v2": ("default", "yarn"), "deepseek_v3": ("default", "yarn"), "qwen3_next": ("default",)}
QWEN3_NEXT_LAYER_TYPES = ("linear_attention", "full_attention")


def _deepseek(raw: dict[str, Any], num_layers: int, what: str) -> Fields:
    """DeepSeek-V2/V3 (and Kimi-K2): MLA's dimensions, the dense first layers, routed and shared experts."""
    size = lambda key, low=1: whole_number(raw[key], f"{what} {key}", low)  # noqa: E731
    q_lora = raw.get("q_lora_rank")
    experts = size("n_routed_experts")
    per_token = raw.get("num_experts_per_tok")
    if per_token is None:  # DeepseekV2Config's default is null: a file must say it
        raise ConfigError(f"{what} num_experts_per_tok=None: set the experts each token is routed to (1 to {experts})")
    fields = {
        "head_dim": size("qk_rope_head_dim"),  # transformers' __post_init__: the rotary part
        # MLA expands the latent to every head's K and V: num_key_value_heads is read by nothing (DeepseekV3Config
        # defaults it to 128 whatever the heads)
        "num_kv_heads": whole_number(raw["num_attention_heads"], f"{what} num_attention_heads", 1),
        "kv_lora_rank": size("kv_lora_rank"),
        "q_lora_rank": None if q_lora is None else whole_number(q_lora, f"{what} q_lora_rank", 1),
        "qk_nope_head_dim": size("qk_nope_head_dim"),
        "qk_rope_head_dim": size("qk_rope_head_dim"),
        "v_head_dim": size("v_head_dim"),
        "first_k_dense_replace": whole_number(raw["first_k_dense_replace"], f"{what} first_k_dense_replace", 0,
                                              num_layers),
        "n_shared_experts": whole_number(raw["n_shared_experts"], f"{what} n_shared_experts", 0),
        "num_experts": experts,
        "num_experts_per_tok": whole_number(per_token, f"{what} num_experts_per_tok", 1, experts),
        "moe_intermediate_size": size("moe_intermediate_size"),
        "norm_topk_prob": _flag(raw, "norm_topk_prob", what),
        **_deepseek_router(raw, what),
        "rope_interleave": raw.get("model_type") == "deepseek_v2" or _flag({"rope_interleave": True, **raw},
                                                                            "rope_interleave", what),
    }
    scaling = _deepseek_yarn(raw, what)
    if scaling is not None:
        fields["rope_scaling"] = scaling
    return fields


V2_TOPK_METHODS = ("greedy", "group_limited_greedy")


def _deepseek_router(raw: dict[str, Any], what: str) -> Fields:
    """The router's grouping and scaling: DeepseekV3TopkRouter always groups (noaux_tc, whatever topk_method
    says); DeepseekV2TopkRouter groups under group_limited_greedy only."""
    v2 = raw.get("model_type") == "deepseek_v2"
    method = raw.get("topk_method") or "greedy" if v2 else "noaux_tc"
    if v2 and method not in V2_TOPK_METHODS:
        raise ConfigError(f"{what} topk_method={method!r} is not supported; allowed: {', '.join(V2_TOPK_METHODS)}")
    grouped = not v2 or method == "group_limited_greedy"
    # read as written: a file that only sizes may hold groups the router could not use (harness/model/deepseek.py
    # check_deepseek refuses those where the model is computed)
    groups = whole_number(raw.get("n_group") or 1, f"{what} n_group", 1) if grouped else 1
    top_groups = whole_number(raw.get("topk_group") or 1, f"{what} topk_group", 1) if grouped else 1
    scaling = finite_number(raw.get("routed_scaling_factor", 1.0), f"{what} routed_scaling_factor", 0)
    return {"n_group": groups, "topk_group": top_groups, "topk_method": method, "routed_scaling_factor": scaling}


def _deepseek_yarn(raw: dict[str, Any], what: str) -> RopeScaling | None:
    """DeepSeek's yarn scaling with its mscale keys (harness/model/hf_config.py read the others and checked them
    all present); None: not yarn, the shared reader's scaling stands."""
    params: dict[str, Any] = {**(raw.get("rope_scaling") or {}), **(raw.get("rope_parameters") or {})}
    if params.get("rope_type", params.get("type")) != "yarn":
        return None
    number = lambda key, default: finite_number(params.get(key, default), f"{what} rope scaling {key}", 0)  # noqa: E731
    return RopeScaling(rope_type="yarn", factor=number("factor", None), beta_fast=number("beta_fast", 32.0),
                       beta_slow=number("beta_slow", 1.0), truncate=bool(params.get("truncate", True)),
                       original_max_position_embeddings=int(params["original_max_position_embeddings"]),
                       mscale=float(params.get("mscale") or 0.0),
                       mscale_all_dim=float(params.get("mscale_all_dim") or 0.0))


def _qwen3_next(raw: dict[str, Any], num_layers: int, what: str) -> Fields:
    """Qwen3-Next: its layer kinds (linear and full attention), Gated DeltaNet's heads and convolution, the
    experts and the gated shared expert; every layer sparse, as published."""
    if raw.get("mlp_only_layers") or raw.get("decoder_sparse_step", 1) != 1:
        raise ConfigError(f"{what} mlp_only_layers={raw.get('mlp_only_layers')!r} decoder_sparse_step="
                          f"{raw.get('decoder_sparse_step', 1)!r}: dense layers among sparse ones are not "
                          "supported; allowed: mlp_only_layers [] and decoder_sparse_step 1")
    interval = whole_number(raw["full_attention_interval"], f"{what} full_attention_interval", 1)
    derived = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(num_layers)]
    kinds = raw.get("layer_types") or derived
    if not isinstance(kinds, list) or len(kinds) != num_layers:
        raise ConfigError(f"{what} layer_types must list one kind per layer ({num_layers}), got {kinds!r}")
    for i, kind in enumerate(kinds):
        if kind not in QWEN3_NEXT_LAYER_TYPES:
            raise ConfigError(f"{what} layer_types[{i}]={kind!r}: layer {i}'s attention kind is not supported; "
                              f"allowed: {', '.join(QWEN3_NEXT_LAYER_TYPES)}")
    size = lambda key: whole_number(raw[key], f"{what} {key}", 1)  # noqa: E731
    experts = size("num_experts")
    heads = {k: size(k) for k in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                  "linear_value_head_dim")}
    if heads["linear_num_value_heads"] % heads["linear_num_key_heads"]:
        raise ConfigError(f"{what} linear_num_value_heads={heads['linear_num_value_heads']} must be a multiple of "
                          f"linear_num_key_heads={heads['linear_num_key_heads']} (each key head serves whole value "
                          "heads)")
    return {
        "layer_types": list(kinds),
        "sliding_window": None,
        "qk_norm": True,
        **heads,
        "linear_conv_kernel_dim": whole_number(raw["linear_conv_kernel_dim"], f"{what} linear_conv_kernel_dim", 1),
        "num_experts": experts,
        "num_experts_per_tok": whole_number(raw["num_experts_per_tok"], f"{what} num_experts_per_tok", 1, experts),
        "moe_intermediate_size": size("moe_intermediate_size"),
        "shared_expert_intermediate_size": whole_number(raw["shared_expert_intermediate_size"],
                                                        f"{what} shared_expert_intermediate_size", 0),
        "norm_topk_prob": _flag(raw, "norm_topk_prob", what),
        "partial_rotary_factor": _partial_rotary(raw, what),
    }


def _partial_rotary(raw: dict[str, Any], what: str) -> float:
    """Qwen3-Next's share of each head that RoPE rotates: ``rope_parameters.partial_rotary_factor`` (transformers 5;
    a top-level key in older files), 0.25 when neither says (Qwen3NextConfig's default); it must rotate an even,
    non-zero number of dims."""
    params = raw.get("rope_parameters") or {}
    factor = finite_number(params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 0.25)),
                           f"{what} partial_rotary_factor", 0)
    rotated = int(raw["head_dim"] * factor)
    if not 0 < factor <= 1 or rotated < 2 or rotated % 2:
        raise ConfigError(f"{what} partial_rotary_factor={factor}: RoPE must rotate an even number of dims, at least "
                          f"2, of head_dim={raw['head_dim']} (got {rotated}); allowed: a factor in (0, 1] that does")
    return factor


def _flag(raw: dict[str, Any], key: str, what: str) -> bool:
    value = raw.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(f"{what} {key}={value!r} must be true or false")
    return value


READERS: dict[str, Callable[[dict[str, Any], int, str], Fields]] = {
    "deepseek_v2": _deepseek, "deepseek_v3": _deepseek, "qwen3_next": _qwen3_next}
