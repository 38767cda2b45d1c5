"""scenario=capacity reproduces the seeds' and the PagedAttention paper's figures."""

from __future__ import annotations

import pandas as pd
import pytest

from kvbench.harness.front.job import run_job

SEEDS = ["scenario=capacity", "model=llama-2-7b", "dtype=float16", "max_seq_len=2048", "batch=100",
         "workload=fixed", "workload.prompt_len=100", "workload.output_len=400", "device.memory_gb=141",
         "scenario.concurrency_points=[1,10,100]"]
GB = 1e9


def capacity(compose, tmp_path, impl, overrides):
    out = tmp_path / impl
    rows, code = run_job(compose([f"+impl={impl}", *overrides]), out)
    assert code == 0, rows[0].get("error")
    return rows[0], pd.read_csv(out / "points.csv")


def test_seeds_figure_contiguous_wastes_75_percent_paging_saves_75_gb(compose, tmp_path):
    contiguous, points = capacity(compose, tmp_path, "contiguous", SEEDS)
    paged, _ = capacity(compose, tmp_path, "paged_torch", SEEDS)
    assert contiguous["kv_bytes_per_token"] == 512 * 1024
    # 100 lanes x 2048 tokens x 512 KiB reserved; 100 x 499 tokens hold real states.
    assert contiguous["kv_bytes_reserved"] == 100 * 2048 * 512 * 1024
    waste = 1 - contiguous["kv_bytes_used"] / contiguous["kv_bytes_reserved"]
    assert waste == pytest.approx(0.75, abs=0.02)
    saved = contiguous["kv_bytes_reserved"] - paged["kv_bytes_reserved"]
    assert saved / 2**30 == pytest.approx(75, abs=1.5)  # ~75 GiB (80.5 GB)
    assert paged["kv_used_fraction"] >= 0.96  # the paper's vLLM figure: 96.3%
    assert contiguous["kv_used_fraction"] < 0.40  # prior systems: 20.4-38.2%
    assert contiguous["max_concurrency"] == paged["max_concurrency"] == 100
    # 2048-token lanes vs 32 blocks of 16 for a 500-token request: 4x the sequences
    assert paged["max_concurrency_analytic"] / contiguous["max_concurrency_analytic"] == pytest.approx(4, rel=0.02)
    at100 = points[points.concurrency == 100].set_index("variant")
    assert at100.loc["contiguous", "kv_bytes_reserved"] == contiguous["kv_bytes_reserved"]
    assert at100.loc["paged", "kv_bytes_reserved"] == paged["kv_bytes_reserved"]
    assert (points.groupby("variant").kv_bytes_reserved.apply(lambda s: s.is_monotonic_increasing)).all()


def test_sharing_savings_parallel_sampling_and_prefix(compose, tmp_path):
    base = ["scenario=capacity", "model=llama-2-7b", "dtype=float16", "max_seq_len=1024", "batch=64",
            "device.memory_gb=141", "scenario.concurrency_points=[8]"]
    par, points = capacity(compose, tmp_path, "paged_torch",
                           [*base, "workload=parallel_sampling", "workload.n=4", "workload.num_requests=16"])
    assert par["sharing_savings"] > 0.05
    p8 = points.set_index("variant")
    assert p8.loc["paged_shared", "kv_bytes_reserved"] < p8.loc["paged", "kv_bytes_reserved"]
    pre, _ = capacity(compose, tmp_path / "p", "paged_torch",
                      [*base, "workload=shared_prefix", "workload.num_requests=32"])
    assert pre["sharing_savings"] > 0.3 and pre["cache_hit_tokens"] > 0


def test_budget_too_small_for_weights_is_a_clear_error(compose, tmp_path):
    rows, code = run_job(compose(["+impl=paged_torch", "scenario=capacity", "model=llama-3.1-70b",
                                  "device.memory_gb=80", "dtype=bfloat16"]), tmp_path)
    assert code == 2 and rows[0]["status"] == "error"
    assert "device.memory_gb" in rows[0]["error"] and "weights need" in rows[0]["error"]


def test_request_that_never_fits_is_rejected_not_dropped(compose, tmp_path):
    row, _ = capacity(compose, tmp_path, "paged_torch", [
        "scenario=capacity", "model=tiny-llama", "max_seq_len=4096", "batch=4", "workload=fixed",
        "workload.prompt_len=64", "workload.output_len=3000", "workload.num_requests=3",
        "device.kv_cache_gb=0.004", "scenario.concurrency_points=[1]"])
    assert row["rejected"] == 3 and "rejected" in row["notes"]


@pytest.mark.parametrize("impl", ["contiguous", "paged_torch"])
def test_pool_too_small_for_one_request_is_a_clear_error(compose, tmp_path, impl):
    rows, code = run_job(compose([f"+impl={impl}", "scenario=capacity", "model=tiny-llama", "max_seq_len=512",
                                  "workload=fixed", "workload.prompt_len=100", "workload.output_len=10",
                                  "device.kv_cache_gb=0.0001"]), tmp_path)
    assert code == 2 and rows[0]["status"] == "error"
    assert "raise device.kv_cache_gb" in rows[0]["error"]  # the key that sized the pool


def test_more_samples_than_batch_are_rejected_not_waited_on_forever(compose, tmp_path):
    row, _ = capacity(compose, tmp_path, "paged_torch", [
        "scenario=capacity", "model=tiny-llama", "batch=2", "workload=parallel_sampling", "workload.n=3",
        "workload.num_requests=2", "scenario.concurrency_points=[1]"])
    assert row["rejected"] == 2 and "exceed batch=2" in row["notes"]


def test_activation_budget_covers_the_largest_forward(compose):
    """A batched prefill of up to max_num_batched_tokens tokens is budgeted, as vLLM profiles it."""
    from kvbench.harness.kv.budget import forward_tokens_bound, kv_budget
    from kvbench.harness.front.resolve import resolve

    cfg = resolve(compose(["scenario=capacity", "model=llama-2-7b", "max_seq_len=2048", "batch=64",
                           "device.memory_gb=80", "max_num_batched_tokens=8192"]))
    assert forward_tokens_bound(cfg) == 8192
    assert forward_tokens_bound(cfg, [100] * 10) == 1000  # the workload has no more prompt tokens
    assert forward_tokens_bound(cfg, [5000, 10] + [100] * 100) == 8192
    assert forward_tokens_bound(cfg, [3] * 4) == 64  # a decode step of every running sequence
    small = resolve(compose(["scenario=capacity", "model=llama-2-7b", "max_seq_len=2048", "batch=64",
                             "device.memory_gb=80", "max_num_batched_tokens=2048"]))
    assert kv_budget(cfg).activation_bytes > kv_budget(small).activation_bytes


@pytest.mark.parametrize("model", ["llama-3.1-8b", "llama-3.1-70b"])
def test_fp8_kv_doubles_what_the_same_budget_holds(compose, tmp_path, model):
    """The same budget at kv_dtype=fp8_e4m3 holds twice bf16's tokens (per-tensor scales), and
    256/132 of them with a scale per token and head."""
    base = ["scenario=capacity", f"model={model}", "dtype=bfloat16", "max_seq_len=4096", "batch=16",
            "workload=fixed", "workload.prompt_len=1000", "workload.output_len=1000", "device.memory_gb=282",
            "scenario.concurrency_points=[1,16]"]
    rows = {kv: capacity(compose, tmp_path / "_".join(kv), "paged_torch", [*base, f"kv_dtype={kv[0]}",
                                                                           f"kv_scale={kv[1]}"])[0]
            for kv in (("auto", "tensor"), ("fp8_e4m3", "tensor"), ("fp8_e4m3", "token_head"))}
    bf16, fp8, heads = rows["auto", "tensor"], rows["fp8_e4m3", "tensor"], rows["fp8_e4m3", "token_head"]
    assert bf16["kv_bytes_per_token"] == 2 * fp8["kv_bytes_per_token"]
    assert bf16["kv_bytes_per_token"] / heads["kv_bytes_per_token"] == pytest.approx(256 / 132)
    assert fp8["max_concurrency_analytic"] / bf16["max_concurrency_analytic"] == pytest.approx(2, rel=0.01)
    assert heads["max_concurrency_analytic"] / bf16["max_concurrency_analytic"] == pytest.approx(256 / 132, rel=0.01)
    assert fp8["kv_bytes_reserved"] * 2 == bf16["kv_bytes_reserved"]  # the same 16 requests, half the bytes
    assert (fp8["kv_dtype"], heads["kv_scale"], bf16["kv_scale"]) == ("fp8_e4m3", "token_head", None)


def test_a_sweeps_jobs_share_one_points_table_per_setting_each_naming_its_own_run(compose, tmp_path, monkeypatch):
    from kvbench.harness.scenarios import capacity as capacity_mod

    computed = []
    real = capacity_mod._concurrency_points
    monkeypatch.setattr(capacity_mod, "_POINTS", {})
    monkeypatch.setattr(capacity_mod, "_concurrency_points", lambda ctx, kv: computed.append(1) or real(ctx, kv))
    _, first = capacity(compose, tmp_path / "a", "contiguous", SEEDS)
    _, again = capacity(compose, tmp_path / "b", "paged_torch", SEEDS)  # another impl of the same setting
    assert len(computed) == 1
    assert first.drop(columns="run_id").equals(again.drop(columns="run_id"))
    assert first.run_id.str.contains("/a/").all() and again.run_id.str.contains("/b/").all()
    _, other = capacity(compose, tmp_path / "c", "contiguous", [*SEEDS, "workload.prompt_len=200"])  # its own
    assert len(computed) == 2 and not other.kv_bytes_reserved.equals(first.kv_bytes_reserved)
