"""scenario=capacity under each kv_manager: one attention kind gives today's rows; sliding layers hold less."""

from __future__ import annotations

import pandas as pd
import pytest

from kvbench.harness.errors import ConfigError
from kvbench.harness.front.job import run_job

BASE = ["scenario=capacity", "model=tiny-llama", "dtype=float16", "max_seq_len=2048", "batch=16",
        "workload=fixed", "workload.prompt_len=600", "workload.output_len=200", "workload.num_requests=24",
        "device.memory_gb=1", "device.kv_cache_gb=0.016", "scenario.concurrency_points=[1,4,16]", "+impl=paged_torch",
        "impl.prefix_caching=false", "timeline_tables=false"]
SLIDING = ["model.layer_types=[sliding_attention,full_attention,sliding_attention,full_attention]",
           "model.sliding_window=128"]
# What a row's figures are (not its identifiers, its wall time or its run's folder).
FIGURES = ["kv_bytes_reserved", "kv_bytes_used", "kv_bytes_logical", "max_concurrency", "max_concurrency_analytic",
           "preemptions", "decode_steps", "budget_kv_bytes", "kv_bytes_per_token", "kv_groups"]


def run(compose, tmp_path, manager, extra=()):
    out = tmp_path / manager
    rows, code = run_job(compose([*BASE, f"kv_manager={manager}", *extra]), out)
    assert code == 0, rows[0].get("error")
    return rows[0], pd.read_csv(out / "points.csv")


def test_one_attention_kind_gives_identical_rows_under_every_manager(compose, tmp_path):
    rows = {m: run(compose, tmp_path, m) for m in ("uniform", "hybrid", "split_pools")}
    base_row, base_points = rows["uniform"]
    for manager, (row, points) in rows.items():
        assert row["kv_manager"] == manager and row["kv_groups"] == "full:4"
        assert {k: row[k] for k in FIGURES} == {k: base_row[k] for k in FIGURES}
        pd.testing.assert_frame_equal(points.drop(columns=["kv_manager", "run_id"]),
                                      base_points.drop(columns=["kv_manager", "run_id"]))


def test_sliding_layers_hold_their_window_under_hybrid_and_split_pools(compose, tmp_path):
    uniform, _ = run(compose, tmp_path, "uniform", SLIDING)
    hybrid, points = run(compose, tmp_path, "hybrid", SLIDING)
    split, _ = run(compose, tmp_path, "split_pools", [*SLIDING, "swa_full_tokens_ratio=0.25"])
    assert uniform["kv_groups"] == "full:4" and hybrid["kv_groups"] == split["kv_groups"] == "full:2,sliding128:2"
    assert hybrid["kv_bytes_per_token"] == uniform["kv_bytes_per_token"]  # every layer, per token, as before
    # 800-token requests: the sliding half keeps ~144 tokens, so a sequence takes ~59% of uniform's blocks
    assert hybrid["max_concurrency_analytic"] == pytest.approx(uniform["max_concurrency_analytic"] / 0.59, rel=0.05)
    assert hybrid["max_concurrency"] >= uniform["max_concurrency"] and split["max_concurrency"] >= 1
    at16 = points[points.concurrency == 16].set_index("variant")
    assert at16.loc["paged", "kv_bytes_reserved"] < at16.loc["contiguous", "kv_bytes_reserved"]


def test_hybrid_caches_prefixes_across_groups_and_split_pools_refuses_them(compose, tmp_path):
    from kvbench.harness.front.resolve import resolve

    caching = [o for o in BASE if o != "impl.prefix_caching=false"]
    out = tmp_path / "hybrid_prefix"
    rows, code = run_job(compose([*caching, "kv_manager=hybrid", *SLIDING, "workload.shared_prefix_len=512"]), out)
    assert code == 0, rows[0].get("error")
    # every prompt after the first hits the shared prefix's blocks in every group (impls/group_prefix.py)
    assert rows[0]["cache_hit_tokens"] >= 23 * 512 and rows[0]["prefix_hit_rate"] > 0.8
    cfg = compose([*caching, "kv_manager=split_pools", *SLIDING])
    with pytest.raises(ConfigError, match="kv_manager=split_pools with impl.prefix_caching=true"):
        resolve(cfg)
    with pytest.raises(ConfigError, match="impl.eviction=lfu with kv_manager=hybrid .* allowed: impl.eviction=lru"):
        resolve(compose([*caching, "kv_manager=hybrid", *SLIDING, "impl.eviction=lfu"]))
