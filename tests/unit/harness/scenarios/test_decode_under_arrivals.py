"""The decode scenario under arrivals, end to end: the requests/steps tables, the service
columns, and the max-rate search on the real model."""

from __future__ import annotations

import pandas as pd
import pytest

from kvbench.harness.front.job import run_job

SMALL = ["model=tiny-llama", "device=cpu", "max_seq_len=64", "scenario.warmup=0", "batch=4",
         "workload=uniform", "workload.num_requests=8", "workload.prompt_len=12", "workload.output_len=6"]


def test_poisson_run_tables_and_digest(compose, tmp_path):
    rows = {}
    for arrival in ("burst", "poisson"):
        out = tmp_path / arrival
        (row,), code = run_job(compose(["+impl=paged_torch", *SMALL, f"arrival={arrival}", "arrival.rate=40",
                                        "slo=interactive"]), out)
        assert code == 0, row.get("error")
        rows[arrival] = row
        reqs = pd.read_parquet(out / "requests.parquet")
        assert sorted(reqs.request_id) == list(range(8)) and set(reqs.impl) == {"paged_torch"}
        ttft = reqs.first_token_s - reqs.arrival_s
        assert (ttft >= 0).all() and (reqs.finish_s - reqs.arrival_s >= ttft).all()
        assert (reqs.admitted_s >= reqs.arrival_s).all()
        steps = pd.read_csv(out / "steps.csv")
        assert set(steps.kind) == {"prefill", "decode"} and steps.t_s.is_monotonic_increasing
        assert (steps.kv_used_bytes <= steps.kv_reserved_bytes).all() and steps.tokens.sum() >= 8 * 6
    burst, poisson = rows["burst"], rows["poisson"]
    assert burst["output_digest"] == poisson["output_digest"]  # arrivals change timing, never tokens
    assert burst["workload_digest"] != poisson["workload_digest"]  # the digest covers arrival times
    assert burst["arrival"] == "burst" and burst["request_rate"] is None and burst["idle_s"] == 0
    assert poisson["request_rate"] == 40 and poisson["clock"] == "wall" and poisson["slo"] == "interactive"
    assert reqs.arrival_s.max() > 0 and poisson["duration_s"] >= reqs.arrival_s.max()
    for m in ("ttft", "tpot", "itl", "e2el", "queue"):
        assert poisson[f"{m}_ms_p50"] <= poisson[f"{m}_ms_p90"] <= poisson[f"{m}_ms_p99"]
    assert poisson["ttft_ms_p50"] <= poisson["e2el_ms_p50"] and poisson["normalized_latency_s"] > 0
    assert 0 <= poisson["slo_attainment"] <= 1 and poisson["goodput_rps"] <= poisson["achieved_rps"]


@pytest.mark.parametrize("bound_s, want", [(60.0, 200.0), (1e-9, 0.0)])
def test_max_rate_searches_and_lists_probes(compose, tmp_path, bound_s, want):
    """A bound every rate meets finds the search limit; one no rate meets finds 0 (timing-proof either way)."""
    (row,), code = run_job(compose(["+impl=paged_torch", *SMALL, "scenario=max_rate", "arrival=poisson",
                                    f"slo.normalized_latency_s={bound_s}", "scenario.start_rps=50",
                                    "scenario.search_limit=200", "scenario.tolerance_rps=20"]), tmp_path)
    assert code == 0, row.get("error")
    probes = pd.read_parquet(tmp_path / "rate_probes.parquet")
    assert len(probes) == row["probes"] >= 1 and set(probes.impl) == {"paged_torch"}
    assert row["max_rate_rps"] == want == max(probes[probes.slo_pass].rate_rps, default=0.0)
    # doubling 50 -> 100 -> 200 (the limit); or 50 fails, then bisection down to the tolerance
    assert list(probes.rate_rps) == ([50.0, 100.0, 200.0] if want else [50.0, 25.0, 12.5])


@pytest.mark.parametrize("overrides, key", [
    (["scenario=max_rate", "arrival=poisson"], "slo"),  # no limit to search against
    (["scenario=max_rate", "slo=interactive"], "arrival.name"),  # burst has no rate
    (["slo.percentile=0"], "slo.percentile"),
    (["slo.ttft_ms=-1"], "slo.ttft_ms"),
])
def test_bad_service_config_is_an_error_row(compose, tmp_path, overrides, key):
    (row,), code = run_job(compose(["+impl=paged_torch", *SMALL, *overrides]), tmp_path)
    assert code == 2 and row["status"] == "error" and key in row["error"]
    assert "\n" not in row["error"]


def test_cpu_threads_is_recorded_and_restored(compose, tmp_path):
    import torch

    import os

    (row,), code = run_job(compose(["+impl=paged_torch", *SMALL, "cpu_threads=1"]), tmp_path / "one")
    assert code == 0 and row["cpu_threads"] == 1 and torch.get_num_threads() == 1
    # null: the cores other work left free at the job's start, recorded, never a later job's leftover 1
    (row,), code = run_job(compose(["+impl=paged_torch", *SMALL]), tmp_path / "default")
    assert code == 0 and 1 <= row["cpu_threads"] <= (os.cpu_count() or 1)
    assert torch.get_num_threads() == row["cpu_threads"]
