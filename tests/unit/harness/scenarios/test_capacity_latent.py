"""scenario=capacity on the models whose caches are not K and V per head, at real size: DeepSeek-V3's latent
(and the same model cached as ordinary attention beside it), Qwen3-Next's K/V per token and state per sequence,
both counted in one budget, and a shared-prefix workload's hit rate with and without a recurrent state."""

from __future__ import annotations

from kvbench.harness.front.job import run_job

BASE = ["scenario=capacity", "dtype=bfloat16", "max_seq_len=8192", "batch=512", "workload=fixed",
        "workload.prompt_len=7792", "workload.output_len=400", "device.memory_gb=1206", "device.kv_cache_gb=20",
        "+impl=paged_torch", "impl.prefix_caching=false", "chunked_prefill=true", "max_num_batched_tokens=8192",
        "scenario.concurrency_points=[1]", "timeline_tables=false"]


def row(compose, tmp_path, *extra, base=BASE):
    rows, code = run_job(compose([*base, *extra]), tmp_path)
    assert code == 0, rows[0].get("error")
    return rows[0]


def test_deepseek_v3_caches_its_latent(compose, tmp_path):
    r = row(compose, tmp_path, "model=deepseek-v3", "workload.num_requests=40")
    assert r["kv_groups"] == "latent:61" and r["kv_bytes_per_token"] == 70_272 and r["state_bytes_per_seq"] == 0
    assert r["kv_bytes_per_token_mha"] == 4_997_120
    assert r["max_concurrency_analytic"] == 20_000_000_000 // (512 * 16 * 70_272) == 34
    # chunked prefill: beside the sequences that hold their whole 8K, the next prompts' first chunks are resident too
    assert 34 <= r["max_concurrency"] <= 34 + 2
    assert r["max_concurrency_mha_analytic"] == 0  # 8K tokens as ordinary attention: 40.9 GB a sequence


def test_qwen3_next_counts_k_v_and_state_in_one_pool(compose, tmp_path):
    r = row(compose, tmp_path, "model=qwen3-next-80b-a3b", "workload.num_requests=100", "kv_manager=hybrid")
    assert r["kv_groups"] == "full:12,linear:36" and r["kv_bytes_per_token"] == 24_576
    assert r["state_bytes_per_seq"] == 39_518_208 and r["kv_bytes_per_token_mha"] is None
    page = 16 * 12 * 2048
    per_seq = 512 * page + 3 * 34 * page  # 8,192 tokens of K/V, and 3 state groups of 34 pages
    assert r["max_concurrency_analytic"] == 20_000_000_000 // page // (512 + 3 * 34) == 20_000_000_000 // per_seq
    assert r["max_concurrency_analytic"] <= r["max_concurrency"] <= r["max_concurrency_analytic"] + 3
    assert r["max_concurrency_analytic"] == 82  # 243 MB a sequence: 201 MB of K/V, 40.1 MB of state pages


def test_a_recurrent_state_serves_no_prefix_hit(compose, tmp_path):
    """The same shared-prefix workload: Qwen3-30B-A3B (full attention only) reuses the shared prefix, Qwen3-Next
    reuses none (no state kept mid-prompt): its rows say so."""
    keep = [o for o in BASE if not o.startswith(("workload", "max_seq_len", "batch", "impl.prefix_caching"))]
    shared = [*keep, "workload=shared_prefix", "workload.num_requests=64", "impl.prefix_caching=true",
              "max_seq_len=4096", "workload.prompt_len=2000", "workload.shared_prefix_len=1536",
              "workload.output_len=48", "batch=64"]
    dense = row(compose, tmp_path / "dense", "model=qwen3-30b-a3b", base=shared)
    nxt = row(compose, tmp_path / "next", "model=qwen3-next-80b-a3b", base=shared)
    assert dense["prefix_hit_rate"] > 0.5 and dense["prefix_hit_rate_ideal"] == nxt["prefix_hit_rate_ideal"]
    assert nxt["prefix_hit_rate"] == 0 and "prefix caching off: a linear_attention layer" in nxt["notes"]



def test_a_state_model_under_uniform_is_refused_in_one_row_naming_hybrid(compose, tmp_path):
    rows, code = run_job(compose([*BASE, "model=qwen3-next-80b-a3b", "workload.num_requests=4", "kv_manager=uniform"]),
                         tmp_path)
    assert code == 2 and rows[0]["status"] == "error"  # at validation, before the run: one line
    assert "kv_manager=uniform caches every layer as full attention" in rows[0]["error"]
    assert "allowed: a paged impl (+impl=paged_torch, ...) with kv_manager=hybrid" in rows[0]["error"]
