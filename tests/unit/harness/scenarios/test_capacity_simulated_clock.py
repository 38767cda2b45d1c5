"""The capacity scenario on the simulated clock (gpu=NAME): service columns, tables, ITL, max rate."""

from __future__ import annotations

import random

import pandas as pd
import pytest

from kvbench.harness.measure.metrics import percentile
from kvbench.harness.front.job import run_job
from kvbench.harness.serving.service_metrics import weighted_percentile, weighted_percentiles

# Llama-2-13B on one A100-40GB (the paper's Figure 12 setting, OPT-13B's closest kin here), a short trace.
SIM = ["scenario=capacity", "model=llama-2-13b", "gpu=a100-40gb", "max_seq_len=2048", "batch=64",
       "workload=sharegpt", "workload.num_requests=120", "arrival=poisson"]


@pytest.mark.parametrize("seed", range(10))
def test_weighted_percentile_equals_the_expanded_one(seed):
    rng = random.Random(seed)
    values = [rng.uniform(0, 5) for _ in range(rng.randint(1, 12))]
    counts = [rng.randint(0, 6) for _ in values]
    counts[0] += 1
    expanded = [v for v, c in zip(values, counts) for _ in range(c)]
    qs = (0, 1, 50, 90, 99, 100)
    for q, together in zip(qs, weighted_percentiles(values, counts, qs)):  # one sort for all of them
        assert weighted_percentile(values, counts, q) == together == pytest.approx(percentile(expanded, q))
    assert weighted_percentiles(values, [0] * len(values), qs) == [None] * len(qs)


def test_capacity_on_the_simulated_clock(compose, tmp_path):
    (row,), code = run_job(compose(["+impl=paged_torch", *SIM, "arrival.rate=2", "slo=interactive"]), tmp_path)
    assert code == 0, row.get("error")
    assert row["clock"] == "simulated" and row["gpu"] == "1x a100-40gb" and row["request_rate"] == 2
    reqs = pd.read_parquet(tmp_path / "requests.parquet")
    assert sorted(reqs.request_id) == list(range(120))
    assert (reqs.admitted_s >= reqs.arrival_s).all() and (reqs.first_token_s > reqs.admitted_s).all()
    assert (reqs.finish_s >= reqs.first_token_s).all()
    assert row["duration_s"] == pytest.approx(reqs.finish_s.max())
    steps = pd.read_parquet(tmp_path / "steps.parquet")
    assert steps.t_s.is_monotonic_increasing and steps.steps.sum() == row["decode_steps"] + (steps.kind == "prefill").sum()
    for m in ("ttft", "tpot", "itl", "e2el", "queue"):
        assert row[f"{m}_ms_p50"] <= row[f"{m}_ms_p99"]
    assert 0 <= row["slo_attainment"] <= 1 and row["normalized_latency_s"] > 0


def test_simulated_rows_have_throughput_over_the_simulated_duration(compose, tmp_path):
    """tokens_per_s and output_tokens_per_s as the decode rows define them, over the simulated clock's duration;
    a clockless capacity row has no duration and so no rate."""
    (row,), code = run_job(compose(["+impl=paged_torch", *SIM, "workload.num_requests=24", "arrival.rate=2"]),
                           tmp_path / "sim")
    assert code == 0 and row["clock"] == "simulated" and row["output_tokens"] > 0 and row["duration_s"] > 0
    assert row["output_tokens_per_s"] == pytest.approx(row["output_tokens"] / row["duration_s"])
    assert row["tokens_per_s"] == pytest.approx((row["prompt_tokens"] + row["output_tokens"]) / row["duration_s"])
    (row,), code = run_job(compose(["+impl=paged_torch", "scenario=capacity", "model=tiny-llama"]), tmp_path / "bare")
    assert code == 0 and row.get("output_tokens_per_s") is None and row.get("tokens_per_s") is None


def test_simulated_gaps_add_up_to_each_sequences_decode_time():
    """Every gap between a sequence's tokens is counted once: without preemption, the gaps of all
    sequences sum to the sum of (finish - first token) over the sequences."""
    from kvbench.harness.serving.cost_model import CostModel, GpuSpec, ModelCost
    from kvbench.harness.serving.simulator import simulate
    from kvbench.harness.serving.workload import Request
    from kvbench.impls.block_manager import BlockManager

    rng = random.Random(3)
    reqs = [Request(i, tuple(rng.randrange(100) for _ in range(rng.randint(5, 60))), rng.randint(1, 40),
                    arrival_s=0.01 * i) for i in range(40)]
    gpu = GpuSpec("t", 40, 1000, 100, 0.8, 0.6, 500, 100, 5)
    clock = CostModel(gpu, ModelCost(10**9, 2 * 10**9, 4096, 8, 1024, 2))
    sim = simulate(BlockManager(4096, 16), reqs, 8, 256, 100, 4096, clock=clock,
                   arrival_s=[r.arrival_s for r in reqs])
    assert sim.preemptions == 0 and len(sim.sequences) == 40
    gaps, counts = sim.itl
    assert sum(g * c for g, c in zip(gaps, counts)) == pytest.approx(
        sum(s.finish_s - s.first_token_s for s in sim.sequences))
    assert sum(counts) == sum(r.output_len - 1 for r in reqs)


def test_simulated_max_rate_matches_a_brute_force_grid(compose, tmp_path):
    slo = ["slo.normalized_latency_s=0.08"]
    (row,), code = run_job(compose(["+impl=paged_torch", *SIM, *slo, "scenario=max_rate", "scenario.probe=capacity",
                                    "scenario.start_rps=1", "scenario.tolerance_rps=0.25",
                                    "scenario.search_limit=64"]), tmp_path / "search")
    assert code == 0, row.get("error")
    assert row["clock"] == "simulated" and row["probes"] >= 3
    assert row["clock_source"].startswith("roofline-v")  # what priced the passing probe
    passing = []
    for rate in [0.5 * k for k in range(1, 25)]:
        (r,), code = run_job(compose(["+impl=paged_torch", *SIM, *slo, f"arrival.rate={rate}"]),
                             tmp_path / f"grid{rate}")
        assert code == 0
        passing.append((rate, bool(r["slo_pass"])))
    best = max((rate for rate, ok in passing if ok), default=0.0)
    assert 0 < best < 12  # the bound bites inside the grid
    assert abs(row["max_rate_rps"] - best) <= 0.5  # the grid's step (the search's tolerance is finer)


def test_rows_label_the_slo_by_its_limits(compose, tmp_path):
    """Custom limits on slo=none, or a preset with one limit changed, are labelled by the limits in the
    service row and the max-rate row alike, and the report's max-rate table shows that label."""
    from kvbench.harness.report.markdown import max_rate_markdown

    small = [*SIM, "workload.num_requests=24", "arrival.rate=2"]
    (row,), code = run_job(compose(["+impl=paged_torch", *small, "slo.ttft_ms=100"]), tmp_path / "custom")
    assert code == 0 and row["slo"] == "ttft_ms<=100@p99" and row["slo_pass"] is not None
    (row,), code = run_job(compose(["+impl=paged_torch", *small, "slo=interactive", "slo.tpot_ms=50"]), tmp_path / "o")
    assert code == 0 and row["slo"] == "ttft_ms<=450,tpot_ms<=50@p99"
    (row,), code = run_job(compose(["+impl=paged_torch", *small, "slo=interactive"]), tmp_path / "preset")
    assert code == 0 and row["slo"] == "interactive"
    (row,), code = run_job(compose(["+impl=paged_torch", *small, "slo.tpot_ms=10", "slo.percentile=50",
                                    "scenario=max_rate", "scenario.probe=capacity", "scenario.start_rps=1",
                                    "scenario.tolerance_rps=1", "scenario.search_limit=4"]), tmp_path / "max_rate")
    assert code == 0, row.get("error")
    assert row["slo"] == "tpot_ms<=10@p50"
    table = max_rate_markdown(pd.DataFrame([{**row, "run_dir": "r", "device_slug": "d"}]))
    assert "| tpot_ms<=10@p50 |" in table and "none" not in table


def test_a_clockless_bookkeeping_run_refuses_arrivals(compose, tmp_path):
    (row,), code = run_job(compose(["+impl=paged_torch", "scenario=capacity", "model=tiny-llama",
                                    "arrival=poisson", "arrival.rate=3"]), tmp_path)
    assert code == 2 and "gpu=NAME" in row["error"] and "a100-40gb" in row["error"]


def test_timeline_tables_can_be_left_out(compose, tmp_path):
    (row,), code = run_job(compose(["+impl=paged_torch", *SIM, "arrival.rate=2", "timeline_tables=false"]), tmp_path)
    assert code == 0 and row["normalized_latency_s"] > 0
    assert not (tmp_path / "requests.parquet").exists() and not (tmp_path / "steps.csv").exists()
