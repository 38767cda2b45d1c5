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


@pytest.mark.parametrize("name, arch", [("gpt-oss-20b", "gpt_oss"), ("gemma-3-27b", "gemma3_text")])
def test_families_not_computed_are_refused_by_name(name: str, arch: str) -> None:
    refusal = compute_refusal(resolve_model_config(load_named(name)))
    assert refusal is not None and f"model.architecture={arch}" in refusal
    assert "llama, mistral, qwen2, qwen3, qwen3_moe" in refusal and "scenario=capacity" in refusal


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
    for name in ("qwen3-32b", "qwen3-30b-a3b", "tiny-qwen3", "llama-3.1-8b", "mistral-7b"):
        assert compute_refusal(resolve_model_config(load_named(name))) is None


def test_build_cache_sets_the_models_windows(compose) -> None:
    from kvbench.harness.kv.factory import build_cache

    cfg = compose(["+impl=paged_torch", "model=tiny-qwen3", "dtype=float32", "device=cpu", "batch=2",
                   "max_seq_len=64", "block_size=8", "kv_manager=uniform"])
    cfg.model.layer_types = ["full_attention"] + ["sliding_attention"] * (cfg.model.num_layers - 1)
    cfg.model.sliding_window = 16
    cache = build_cache(cfg.impl, cfg, 1 << 22, torch.device("cpu"))
    assert cache.windows == [0] + [16] * (cfg.model.num_layers - 1)


def test_build_model_refuses_a_family_it_does_not_compute() -> None:
    cfg = load_named("gpt-oss-20b")
    with pytest.raises(ConfigError, match=r"model\.architecture=gpt_oss"):
        build_model(cfg, torch.bfloat16, "meta", seed=0)


def test_a_decode_run_refuses_in_one_line_and_capacity_runs_on_the_config_json_alone(compose, tmp_path) -> None:
    folder = tmp_path / "gpt-oss-tiny"
    make_hf_model("gpt-oss").config.save_pretrained(folder)  # config.json, no weights
    common = [f"model.path={folder}", "dtype=float32", "device=cpu", "batch=4", "max_seq_len=64", "block_size=8",
              "workload=fixed", "workload.prompt_len=16", "workload.output_len=8"]
    rows, code = run_job(compose(["+impl=paged_torch", *common]), tmp_path / "decode")
    assert code != 0 and "model.architecture=gpt_oss" in rows[0]["error"]
    assert "\n" not in rows[0]["error"]
    rows, code = run_job(compose(["+impl=paged_torch", "scenario=capacity", "impl.prefix_caching=false", *common]),
                         tmp_path / "capacity")
    assert code == 0, rows[0].get("error")
    assert rows[0]["kv_bytes_per_token"] == 2 * 4 * 2 * 32 * 4  # K and V, 4 layers, 2 kv heads x 32, fp32
