"""Greedy generation through the engine equals transformers' `generate`, batched prompts of mixed lengths."""

from __future__ import annotations

import json

import pytest
import torch

from kvbench.harness.front.job import run_job
from tests.helpers.models import make_hf_model


# Qwen3 (its q/k norms) and Qwen3-MoE (its router, normalized top-k or not) through the same engine
@pytest.mark.parametrize("case", ["llama-gqa", "qwen2-tied", "qwen3", "qwen3-bias-tied", "qwen3-moe",
                                  "qwen3-moe-unnormed"])
@pytest.mark.parametrize("impl", ["contiguous", "paged_torch"])
def test_engine_greedy_matches_hf_generate(compose, tmp_path, case, impl):
    hf = make_hf_model(case, seed=1)
    hf.save_pretrained(tmp_path / "hf")
    out = tmp_path / "run"
    rows, code = run_job(compose([
        f"+impl={impl}", f"model.path={tmp_path / 'hf'}", "dtype=float32", "device=cpu", "batch=4",
        "max_seq_len=96", "block_size=8", "workload=uniform", "workload.num_requests=5",
        "workload.prompt_len=20", "workload.spread=0.8", "workload.output_len=12", "workload.distribution=uniform",
        "scenario.warmup=0"]), out)
    assert code == 0, rows[0].get("error")
    assert rows[0]["model"] == "hf"  # the folder's name
    records = [json.loads(line) for line in (out / "tokens.jsonl").read_text().splitlines()]
    assert len({len(r["prompt_ids"]) for r in records}) > 2  # mixed lengths, batched together
    hf.generation_config.eos_token_id = None
    for r in records:
        ids = torch.tensor([r["prompt_ids"]])
        n = len(r["output_ids"])
        with torch.no_grad():
            ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, pad_token_id=0)
        assert ref[0, ids.shape[1]:].tolist() == r["output_ids"], r["request_id"]
