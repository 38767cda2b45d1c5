"""What kvbench computes, and the one-line refusal of the rest (families it only sizes); a sliding window shorter
than the run's context runs, its cache built with the model's windows; a config.json alone is enough for a capacity
run of any family."""

from __future__ import annotations

import pytest
import torch

from kvbench.harness.errors import ConfigError
from kvbench.harness.front.job import run_job
from kvbench.harness.model.hf_config import resolve_model_config
from kvbench.harness.model.support import compute_refusal
from kvbench.harness.model.weights import build_model
from tests.helpers.models import load_named, make_hf_model

pytest.importorskip("transformers")


def test_gemma3_computes_and_refuses_attention_soft_capping_in_one_line() -> None:
    """Gemma 3 (harness/model/gemma3.py) computes; a Gemma 2-style attention soft cap (null in every Gemma 3) is
    computed by no kernel, so it is refused, naming the key, its value and the one allowed."""
    cfg = resolve_model_config(load_named("gemma-3-27b"))
    assert compute_refusal(cfg) is None and compute_refusal(resolve_model_config(load_named("tiny-gemma3"))) is None
    cfg.attn_logit_softcapping = 50.0
    assert compute_refusal(cfg) == ("model.attn_logit_softcapping=50.0: the decoder computes attn_logit_softcapping="
                                    "None only; it loads for scenario=capacity and scenario.probe=capacity (no model "
                                    "compute) only")


@pytest.mark.parametrize("key, value", [("attention_sinks", True), ("hidden_act", "gelu_pytorch_tanh"),
                                        ("query_pre_attn_scalar", 24.0), ("final_logit_softcapping", 30.0)])
def test_a_computed_architecture_with_a_detail_the_decoder_lacks_is_refused(key: str, value) -> None:
    cfg = load_named("tiny-qwen3")
    setattr(cfg, key, value)
    refusal = compute_refusal(resolve_model_config(cfg))
    assert refusal is not None and refusal.startswith(f"model.{key}={value}: the decoder computes {key}=")


def test_a_window_shorter_than_the_context_runs_with_the_cache_built_from_the_models_windows(compose, tmp_path) -> None:
    folder = tmp_path / "mistral-window"
    make_hf_model("mistral-window").save_pretrained(folder)  # an 8-token window on every layer
    common = [f"model.path={folder}", "model.weights=path", "dtype=float32", "device=cpu", "batch=2",
              "max_seq_len=64", "block_size=8", "workload=fixed", "workload.prompt_len=20", "workload.output_len=6",
              "kv_manager=uniform"]
    rows, code = run_job(compose(["+impl=paged_torch", *common]), tmp_path / "run")
    assert code == 0, rows[0].get("error")
    assert rows[0]["status"] == "ok" and rows[0]["kv_manager"] == "uniform"
    for name in ("qwen3-32b", "qwen3-30b-a3b", "tiny-qwen3", "llama-3.1-8b", "mistral-7b", "gpt-oss-20b",
                 "gpt-oss-120b"):
        assert compute_refusal(resolve_model_config(load_named(name))) is None


def test_build_cache_sets_the_models_windows(compose) -> None:
    from kvbench.harness.kv.factory import build_cache

    cfg = compose(["+impl=paged_torch", "model=tiny-qwen3", "dtype=float32", "device=cpu", "batch=2",
                   "max_seq_len=64", "block_size=8", "kv_manager=uniform"])
    cfg.model.layer_types = ["full_attention"] + ["sliding_attention"] * (cfg.model.num_layers - 1)
    cfg.model.sliding_window = 16
    cache = build_cache(cfg.impl, cfg, 1 << 22, torch.device("cpu"))
    assert cache.windows == [0] + [16] * (cfg.model.num_layers - 1)


def test_build_model_refuses_a_family_it_does_not_compute(monkeypatch) -> None:
    from kvbench.harness.model import support

    monkeypatch.setattr(support, "COMPUTED_ARCHITECTURES", ("llama",))
    cfg = load_named("gpt-oss-20b")
    with pytest.raises(ConfigError, match=r"model\.architecture=gpt_oss"):
        build_model(cfg, torch.bfloat16, "meta", seed=0)


def test_a_decode_run_refuses_in_one_line_and_capacity_runs_on_the_config_json_alone(compose, tmp_path) -> None:
    folder = tmp_path / "gpt-oss-tiny"
    config = make_hf_model("gpt-oss").config
    config.quantization_config = {"quant_method": "mxfp4"}  # the published files' experts, which kvbench cannot load
    config.save_pretrained(folder)  # config.json, no weights
    common = [f"model.path={folder}", "dtype=float32", "device=cpu", "batch=4", "max_seq_len=64", "block_size=8",
              "workload=fixed", "workload.prompt_len=16", "workload.output_len=8"]
    rows, code = run_job(compose(["+impl=paged_torch", *common]), tmp_path / "decode")
    assert code != 0 and "model.expert_dtype=mxfp4" in rows[0]["error"]
    assert "\n" not in rows[0]["error"]
    rows, code = run_job(compose(["+impl=paged_torch", "scenario=capacity", "impl.prefix_caching=false", *common]),
                         tmp_path / "capacity")
    assert code == 0, rows[0].get("error")
    assert rows[0]["kv_bytes_per_token"] == 2 * 4 * 2 * 32 * 4  # K and V, 4 layers, 2 kv heads x 32, fp32
