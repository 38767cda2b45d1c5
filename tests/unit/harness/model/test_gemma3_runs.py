"""Gemma 3 through the CLI's job (``python -m harness``): a tiny checkpoint by ``model.path`` and the named
tiny-gemma3 with dummy weights decode under kv_manager=uniform, every impl generating the same tokens; the caches
are built (harness/kv/factory.py) with the model's softmax scale."""

from __future__ import annotations

import pytest
import torch

from kvbench.harness.front.job import run_job
from tests.helpers.models import make_hf_model

pytest.importorskip("transformers")

COMMON = ["dtype=float32", "device=cpu", "batch=3", "max_seq_len=128", "block_size=8", "workload=fixed",
          "workload.prompt_len=40", "workload.output_len=12", "workload.num_requests=3", "kv_manager=uniform"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma3-ckpt")
    make_hf_model("gemma3-sliding", seed=3).save_pretrained(folder)
    return folder


def _row(cfg, folder) -> dict:
    rows, code = run_job(cfg, folder)
    assert code == 0, rows[0].get("error")
    assert rows[0]["status"] == "ok" and rows[0]["kv_manager"] == "uniform"
    return rows[0]


def test_a_checkpoint_decodes_with_every_impl_alike(compose, checkpoint, tmp_path):
    model = [f"model.path={checkpoint}", "model.weights=path"]
    digests = {impl: _row(compose([f"+impl={impl}", *model, *COMMON]), tmp_path / impl)["output_digest"]
               for impl in ("paged_torch", "contiguous", "paged")}
    assert len(set(digests.values())) == 1, digests


def test_the_factory_gives_the_cache_the_models_scale(compose, checkpoint):
    from kvbench.harness.kv.factory import build_cache
    from kvbench.harness.model.hf_config import resolve_model_config

    cfg = compose(["+impl=paged_torch", f"model.path={checkpoint}", "model.weights=path", *COMMON])
    cfg.model = resolve_model_config(cfg.model)
    cache = build_cache(cfg.impl, cfg, 1 << 22, torch.device("cpu"))
    assert cache.scale == 48**-0.5 != cfg.model.head_dim**-0.5
    assert cache.windows == [24] * 5 + [0, 24]


def test_the_named_tiny_config_runs_with_dummy_weights(compose, tmp_path):
    row = _row(compose(["+impl=paged_torch", "model=tiny-gemma3", *COMMON]), tmp_path / "tiny")
    assert row["model"] == "tiny-gemma3" and row["output_tokens_per_s"] > 0
