"""A setting measured at one batch (or one context length, or one rate) is a table row, not a panel of dots,
and the figure says which it left out and why."""

from __future__ import annotations

import pandas as pd

from kvbench.harness.report.figures import MAX_FACETS
from kvbench.harness.report.service_plots import normalized_latency
from kvbench.harness.report.speed_plots import decode_throughput, kernel_latency_bandwidth

ENV = {"status": "ok", "device_slug": "cpu-a", "model": "tiny-llama", "dtype": "float32"}


def decode(workload: str, impl: str, batch: int, tps: float) -> dict:
    return {**ENV, "scenario": "decode", "workload": workload, "impl": impl, "batch": batch,
            "output_tokens_per_s": tps}


def test_a_one_batch_setting_leaves_the_figure_and_is_named():
    rows = pd.DataFrame([decode("chat", "contiguous", b, 10.0 * b) for b in (1, 8)]
                        + [decode("uniform", i, 8, 5.0) for i in ("contiguous", "paged_torch")])
    left: list[str] = []
    fig = decode_throughput(rows, {}, left)
    assert len(fig.axes) == 1 and "chat" in fig.axes[0].get_title()
    assert left == ["tiny-llama · uniform · cpu-a (one batch only: its rows are in the table)"]


def test_a_figure_of_single_points_only_is_no_figure():
    left: list[str] = []
    assert decode_throughput(pd.DataFrame([decode("uniform", "contiguous", 8, 5.0)]), {}, left) is None
    assert len(left) == 1 and "one batch only" in left[0]


def test_panels_past_the_limit_are_named_not_dropped_silently():
    rows = pd.DataFrame([decode(f"w{k}", "contiguous", b, 1.0 + b) for k in range(MAX_FACETS + 2) for b in (1, 8)])
    left: list[str] = []
    fig = decode_throughput(rows, {}, left)
    assert len(fig.axes) == MAX_FACETS and len(left) == 2 and all(f"past {MAX_FACETS} panels" in s for s in left)


def test_a_kernel_setting_at_one_context_length_is_named():
    rows = pd.DataFrame([{**ENV, "scenario": "kernel", "impl": "contiguous", "kernel_batch": b, "context_len": c,
                          "latency_us_p50": 10.0 * c, "bandwidth_gbps": 5.0} for b, cs in ((2, (256,)), (4, (256, 1024)))
                         for c in cs])
    left: list[str] = []
    fig = kernel_latency_bandwidth(rows, {}, left)
    assert len(fig.axes) == 2 and len(left) == 1 and "B=2" in left[0] and "one context length only" in left[0]


def test_a_service_setting_at_one_rate_is_named():
    rows = pd.DataFrame([{**ENV, "scenario": "decode", "workload": w, "impl": "contiguous", "batch": 8,
                          "arrival": "poisson", "clock": "wall", "request_rate": r, "normalized_latency_s": 0.1 * r}
                         for w, rates in (("chat", (1.0, 2.0)), ("alpaca", (1.0,))) for r in rates])
    left: list[str] = []
    fig = normalized_latency(rows, {}, left)
    assert fig is not None and len([ax for ax in fig.axes if ax.lines]) == 1
    assert len(left) == 1 and "alpaca" in left[0] and "one rate only" in left[0]


def test_a_capacity_setting_at_one_concurrency_is_named_not_drawn():
    from kvbench.harness.report.memory_plots import memory_vs_concurrency

    points = pd.DataFrame([{"run_dir": "r", "model": "m", "workload": w, "budget_kv_bytes": 1e9, "concurrency": c,
                            "variant": v, "kv_bytes_reserved": 1e8 * c, "kv_bytes_used": 1.0}
                           for w, cs in (("chat", (1, 4)), ("mooncake", (1,))) for c in cs
                           for v in ("contiguous", "paged")])
    fig, left = memory_vs_concurrency(points, pd.DataFrame({"run_dir": ["r"]}))
    assert len(fig.axes) == 1 and left == ["m · mooncake · KV budget 1 GB (one concurrency only: its row is in the table)"]


def test_a_prefix_setting_at_one_cache_size_is_named_not_drawn():
    from kvbench.harness.report.reuse_plots import hit_rate_vs_cache

    rows = pd.DataFrame([{**ENV, "scenario": "capacity", "workload": w, "impl": "paged_torch", "clock": "simulated",
                          "budget_kv_bytes": gb * 1e9, "prefix_hit_rate": 0.1 * gb, "prefix_hit_rate_ideal": 0.9}
                         for w, sizes in (("shared_prefix", (1, 2)), ("mooncake", (1,))) for gb in sizes])
    left: list[str] = []
    fig = hit_rate_vs_cache(rows, left)
    assert fig is not None and len(left) == 1 and "mooncake" in left[0] and "one cache size only" in left[0]
