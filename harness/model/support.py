"""What kvbench computes token for token, and the one-line refusal of a model it only sizes.

Every family loads for scenarios that compute nothing (scenario=capacity, a search with
scenario.probe=capacity): their KV bytes, weights and simulated steps need only the shape. A scenario that
runs the model needs harness/model/llama.py to compute what transformers computes, which it does for the
architectures of ``COMPUTED_ARCHITECTURES``. A sliding window shorter than the run's context is computed by every
cache and kernel (``KVCache.set_layer_windows``, the kernels' ``window``: token for token equal to transformers,
tests/unit/harness/serving/test_engine_parity_window.py), but a run's cache is built without its model's windows
(harness/kv/factory.py ``build_cache`` does not set them yet), so runs still refuse such a model.
"""

from __future__ import annotations

from kvbench.harness.model.config import COMPUTED_ARCHITECTURES, ModelConfig

SIZE_ONLY = "it loads for scenario=capacity and scenario.probe=capacity (no model compute) only"
# Keys the decoder does not compute, at the values that leave them out (a named config could set them on any
# architecture).
NOT_COMPUTED = {"attention_sinks": False, "swiglu_limit": None, "query_pre_attn_scalar": None,
                "rope_local_theta": None, "attn_logit_softcapping": None, "final_logit_softcapping": None,
                "hidden_act": "silu", "expert_dtype": "dtype"}


def compute_refusal(cfg: ModelConfig, max_seq_len: int | None = None) -> str | None:
    """Why ``cfg`` cannot be computed in a run whose sequences reach ``max_seq_len`` tokens; None if it can.

    A sliding window at least ``max_seq_len`` long never hides a token, so such layers compute as full
    attention; ``max_seq_len=None`` (the context not known yet) leaves the windows to the caller.
    """
    if cfg.architecture not in COMPUTED_ARCHITECTURES:
        return (f"model.architecture={cfg.architecture}: kvbench computes {', '.join(COMPUTED_ARCHITECTURES)} "
                f"token for token; {SIZE_ONLY}")
    for key, off in NOT_COMPUTED.items():
        if getattr(cfg, key) != off:
            return f"model.{key}={getattr(cfg, key)}: the decoder computes {key}={off} only; {SIZE_ONLY}"
    if cfg.rope_scaling is not None and cfg.rope_scaling.rope_type != "llama3":
        return (f"model.rope_scaling.rope_type={cfg.rope_scaling.rope_type}: the decoder computes llama3 RoPE "
                f"scaling (or none); {SIZE_ONLY}")
    if max_seq_len is not None and cfg.layer_types is not None and cfg.sliding_window is not None:
        for i, kind in enumerate(cfg.layer_types):
            if kind == "sliding_attention" and cfg.sliding_window < max_seq_len:
                return (f"model layer {i} is sliding_attention with a {cfg.sliding_window}-token window, shorter "
                        f"than max_seq_len={max_seq_len}: a run's KV cache is built without the model's windows yet "
                        f"(the caches and kernels compute them; harness/kv/factory.py does not pass them), so every "
                        f"layer would run as full_attention; set max_seq_len<={cfg.sliding_window}, or {SIZE_ONLY}")
    return None
