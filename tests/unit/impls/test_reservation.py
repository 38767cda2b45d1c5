"""impl.reservation (the paper's Orca baselines): config, sizing, capacity and max concurrency."""

from __future__ import annotations

import pytest

from kvbench.harness.front.job import run_job

TINY = ["model=tiny-llama", "dtype=float32", "device=cpu"]  # 4 KiB of K and V per token
# Lengths 50-150 prompt + 50-150 output: max reserves 512, pow2 128-512, oracle 100-300.
UNIFORM = ["workload=uniform", "workload.prompt_len=100", "workload.output_len=100", "max_seq_len=512"]


def one_row(compose, tmp_path, overrides: list[str]) -> tuple[dict, int]:
    rows, code = run_job(compose(overrides), tmp_path)
    (row,) = rows
    return row, code


def test_oracle_beats_pow2_beats_max_in_max_concurrency(compose, tmp_path):
    """The search's bookkeeping probes on one workload and one KV budget (1953 token slots)."""
    found = {}
    for impl in ("contiguous", "orca_pow2", "orca_oracle"):
        row, code = one_row(compose, tmp_path / impl, [
            f"+impl={impl}", "scenario=max_concurrency", "scenario.probe=capacity", *TINY, *UNIFORM,
            "device.kv_cache_gb=0.008", "scenario.search_limit=64"])
        assert code == 0 and row["status"] == "ok", row.get("error")
        found[impl] = (row["max_concurrency"], row["max_concurrency_analytic"])
    assert found["contiguous"] == (3, 3)  # 1953 // 512
    assert found["orca_oracle"][0] > found["orca_pow2"][0] > found["contiguous"][0]
    assert found["orca_oracle"][1] > found["orca_pow2"][1] > found["contiguous"][1]


def test_analytic_concurrency_is_budget_over_reserved_tokens(compose):
    from kvbench.harness.kv.factory import analytic_max_concurrency
    from kvbench.harness.front.groups import load_impl
    from kvbench.harness.front.resolve import resolve

    cfg = resolve(compose(["scenario=capacity", *TINY, "max_seq_len=2048"]))
    budget = 4096 * 10_000  # 10,000 token slots
    got = {name: analytic_max_concurrency(load_impl(name), cfg, budget, 500)
           for name in ("contiguous", "orca_pow2", "orca_oracle")}
    assert got == {"contiguous": 10_000 // 2048, "orca_pow2": 10_000 // 512, "orca_oracle": 10_000 // 500}


def test_capacity_rows_break_out_external_fragmentation(compose, tmp_path):
    base = ["scenario=capacity", *TINY, "max_seq_len=1024", "batch=64", "workload=chat",
            "workload.prompt_len=200", "workload.output_len=200", "workload.num_requests=200",
            "device.kv_cache_gb=0.02", "scenario.concurrency_points=[1]"]
    rows = {}
    for impl in ("contiguous", "paged_torch", "orca_pow2", "orca_oracle"):
        row, code = one_row(compose, tmp_path / impl, [f"+impl={impl}", *base])
        assert code == 0 and row["status"] == "ok", row.get("error")
        rows[impl] = row
    assert rows["contiguous"]["kv_external_fragmentation_bytes"] == 0
    assert rows["paged_torch"]["kv_external_fragmentation_bytes"] == 0
    for impl in ("orca_pow2", "orca_oracle"):
        r = rows[impl]
        # Free memory stranded in holes, at the snapshot of the most token states: never held memory.
        assert 0 < r["kv_external_fragmentation_bytes"] <= r["kv_pool_bytes"] - r["kv_bytes_used"] - r[
            "kv_reservation_waste_bytes"]
        assert r["kv_fragmentation_bytes"] == 0 and r["rejected"] == 0 and r["preemptions"] == 0
    waste = {impl: rows[impl]["kv_reservation_waste_bytes"] / rows[impl]["kv_bytes_reserved"] for impl in rows}
    assert waste["contiguous"] > waste["orca_pow2"] > waste["orca_oracle"] > 0


def test_orca_max_is_an_alias_of_contiguous(compose, tmp_path):
    from kvbench.harness.front.groups import impl_names

    assert "orca_max" not in impl_names() and {"orca_pow2", "orca_oracle"} <= set(impl_names())
    base = ["scenario=capacity", *TINY, *UNIFORM, "workload.num_requests=20", "scenario.concurrency_points=[1]"]
    alias, _ = one_row(compose, tmp_path / "alias", ["+impl=orca_max", *base])
    plain, _ = one_row(compose, tmp_path / "plain", ["+impl=contiguous", *base])
    assert alias["impl"] == "contiguous" and alias["kv_bytes_reserved"] == plain["kv_bytes_reserved"]


@pytest.mark.parametrize(("overrides", "message"), [
    (["+impl=contiguous", "impl.reservation=half"], "impl.reservation='half' is not allowed; allowed: max, pow2, oracle"),
    (["+impl=paged_torch", "impl.reservation=pow2"], "impl.reservation='pow2' does not apply to impl.cache='paged'"),
])
def test_bad_reservation_is_a_config_error(compose, tmp_path, overrides, message):
    row, code = one_row(compose, tmp_path, [*overrides, "scenario=capacity", *TINY])
    assert code == 2 and row["status"] == "error" and message in row["error"]
