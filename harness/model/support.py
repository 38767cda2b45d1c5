"""What kvbench computes token for token, and the one-line refusal of a model it only sizes.

Every family loads for scenarios that compute nothing (scenario=capacity, a search with
scenario.probe=capacity): their KV bytes, weights and simulated steps need only the shape. A scenario that
runs the model needs harness/model/llama.py to compute what transformers computes, which it does for the
architectures of ``COMPUTED_ARCHITECTURES``. A sliding window is computed by every cache and kernel (harness/kv/factory.py
``build_cache`` sets the model's windows: ``KVCache.set_layer_windows``, the kernels' ``window``; token for token equal
to transformers, tests/unit/harness/serving/test_engine_parity_window.py).
"""

from __future__ import annotations

from kvbench.harness.model.config import COMPUTED_ARCHITECTURES, ModelConfig

SIZE_ONLY = "it loads for scenario=capacity and scenario.probe=capacity (no model compute) only"
# Keys the decoder does not compute, at the values that leave them out (a named config could set them on any
# architecture).
NOT_COMPUTED = {"attention_sinks": False, "swiglu_limit": None, "query_pre_attn_scalar": None,
                "rope_local_theta": None, "attn_logit_softcapping": None, "final_logit_softcapping": None,
                "hidden_act": "silu", "expert_dtype": "dtype"}
# The keys of NOT_COMPUTED that a family's own decoder module computes (harness/model/families.py), and the RoPE
# scalings it computes beside llama3's: one line per family.
FAMILY_COMPUTES: dict[str, tuple[str, ...]] = {}
FAMILY_ROPE_TYPES: dict[str, tuple[str, ...]] = {}
# gpt-oss (harness/model/gpt_oss.py): MXFP4 experts computed at the run's dtype (dummy weights; a checkpoint is refused)
FAMILY_COMPUTES["gpt_oss"] = ("attention_sinks", "swiglu_limit", "expert_dtype")
FAMILY_ROPE_TYPES["gpt_oss"] = ("yarn",)
# Gemma 3 (harness/model/gemma3.py); attn_logit_softcapping (null in every Gemma 3) stays refused: no kernel computes it
FAMILY_COMPUTES["gemma3_text"] = ("query_pre_attn_scalar", "rope_local_theta", "final_logit_softcapping", "hidden_act")
FAMILY_ROPE_TYPES["gemma3_text"] = ("linear",)
# DeepSeek-V2/V3, Kimi-K2 (harness/model/deepseek.py): MLA in the absorbed formulation, yarn with mscale
FAMILY_ROPE_TYPES["deepseek_v2"] = FAMILY_ROPE_TYPES["deepseek_v3"] = ("yarn",)


def traced_decode_refusal(cfg: ModelConfig) -> str | None:
    """Why the model's decode cannot run traced (cuda_graph's pieces, cpu_compile's graph); None if it can. A
    linear_attention layer (Qwen3-Next) reads and rewrites its sequences' state in the cache's pages inside the
    layer, which neither trace holds: those models decode eagerly."""
    if cfg.layer_types is not None and "linear_attention" in cfg.layer_types:
        return (f"model={cfg.name} has linear_attention layers, whose state the cache hands each step to the eager "
                "forward (harness/model/qwen3_next.py): a traced decode holds no state; allowed: cuda_graph=false "
                "and cpu_compile=false or null")
    return None


def compute_refusal(cfg: ModelConfig) -> str | None:
    """Why ``cfg`` cannot be computed token for token; None if it can."""
    if cfg.architecture not in COMPUTED_ARCHITECTURES:
        return (f"model.architecture={cfg.architecture}: kvbench computes {', '.join(COMPUTED_ARCHITECTURES)} "
                f"token for token; {SIZE_ONLY}")
    for key, off in NOT_COMPUTED.items():
        if key not in FAMILY_COMPUTES.get(cfg.architecture, ()) and getattr(cfg, key) != off:
            return f"model.{key}={getattr(cfg, key)}: the decoder computes {key}={off} only; {SIZE_ONLY}"
    if cfg.weights == "path" and cfg.expert_dtype == "mxfp4":
        return (f"model.expert_dtype=mxfp4 (model.path={cfg.path}): kvbench loads no MXFP4 expert weights; allowed: a "
                "checkpoint dequantized to bf16 or fp32 (transformers' Mxfp4Config(dequantize=True), then "
                "save_pretrained), or a named config with dummy weights (model=gpt-oss-20b: experts at the run's "
                f"dtype); {SIZE_ONLY}")
    rope_types = ("llama3", *FAMILY_ROPE_TYPES.get(cfg.architecture, ()))
    if cfg.rope_scaling is not None and cfg.rope_scaling.rope_type not in rope_types:
        return (f"model.rope_scaling.rope_type={cfg.rope_scaling.rope_type}: the {cfg.architecture} decoder computes "
                f"{', '.join(rope_types)} RoPE scaling (or none); {SIZE_ONLY}")
    return None
