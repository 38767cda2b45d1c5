"""End to end on CPU: a tiny Qwen2 checkpoint with a sliding window (layer 0 full, layer 1 sliding over 24 tokens)
decodes under kv_manager=hybrid and split_pools through the grouped paged cache, with the tokens of uniform, and
the rows' memory columns count every group's pages (checked by hand below); a contiguous cache, which has no
groups, says kv_manager=uniform."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbench.harness.front.job import run_job
from tests.helpers.models import make_hf_model

pytest.importorskip("transformers")

BLOCK, LAYER_BYTES = 16, 2 * 2 * 64 * 4  # one layer's K and V of a token: 2 kv heads x head_dim 64, float32
RUN = ["device=cpu", "dtype=float32", "max_seq_len=128", "workload=fixed", "workload.prompt_len=40",
       "workload.output_len=20", "batch=4", "scenario.warmup=0", f"block_size={BLOCK}", "impl.prefix_caching=false"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("qwen2-sliding")
    make_hf_model("qwen2-sliding", seed=3).save_pretrained(folder)
    return folder


def _row(compose, tmp_path: Path, checkpoint: Path, impl: str, manager: str) -> dict:
    out = tmp_path / f"{impl}-{manager}"
    cfg = compose([f"+impl={impl}", f"model.path={checkpoint}", "model.weights=path", f"kv_manager={manager}",
                   *RUN[:-1], *(RUN[-1:] if impl != "contiguous" else [])])
    rows, code = run_job(cfg, out)
    assert code == 0, rows[0].get("error")
    (row,) = rows
    assert row["status"] == "ok"
    return row


def test_hybrid_and_split_pools_decode_with_every_group_counted(compose, tmp_path, checkpoint):
    uniform = _row(compose, tmp_path, checkpoint, "paged_torch", "uniform")
    assert uniform["kv_groups"] == "full:2"
    # uniform: 4 sequences of 59 written tokens, 4 blocks each, every layer: 2 layers x 1 KiB a token
    assert uniform["kv_bytes_reserved"] == 4 * 4 * BLOCK * 2 * LAYER_BYTES
    assert uniform["kv_bytes_used"] == 4 * 59 * 2 * LAYER_BYTES
    for manager in ("hybrid", "split_pools"):
        row = _row(compose, tmp_path, checkpoint, "paged_torch", manager)
        assert row["kv_manager"] == manager and row["kv_groups"] == "full:1,sliding24:1"
        assert row["output_digest"] == uniform["output_digest"]
        # Pages of one layer (16 tokens x 1 KiB). At its peak a sequence holds 4 pages of the full layer and 3 of the
        # sliding one: writing position 48 (a 4th block) drops block 0 only (position 48 reads from 25 on).
        assert row["kv_bytes_reserved"] == 4 * 7 * BLOCK * LAYER_BYTES
        # The most written slots: 55 positions of the full layer, and 16..54 of the sliding one, just before
        # position 55 drops block 1 (it reads from 32 on).
        assert row["kv_bytes_used"] == 4 * (55 + 39) * LAYER_BYTES
        assert row["kv_pool_bytes"] == row["budget_kv_bytes"] // (BLOCK * LAYER_BYTES) * BLOCK * LAYER_BYTES
        assert row["kv_bytes_per_token"] == uniform["kv_bytes_per_token"] == 2 * LAYER_BYTES


def test_a_contiguous_cache_says_uniform(compose, tmp_path, checkpoint):
    """No groups: every layer cached in full (its windows mask), whatever kv_manager asked."""
    row = _row(compose, tmp_path, checkpoint, "contiguous", "hybrid")
    assert row["kv_manager"] == "uniform" and row["kv_groups"] == "full:2"
