"""Reuse figures: hit rate against KV cache size per policy and tier, and TTFT against hit rate."""

from __future__ import annotations

import pandas as pd

from kvbench.harness.report.figures import theme
from kvbench.harness.report.reuse_plots import hit_rate_vs_cache, reuse_rows, reuse_table, ttft_vs_hit_rate


def _rows() -> pd.DataFrame:
    out = []
    for gb, base in ((20, 0.1), (40, 0.3), (60, 0.5)):
        for policy, bump in (("lru", 0.0), ("2q", 0.02)):
            out.append({"scenario": "capacity", "status": "ok", "model": "m", "workload": "multi_turn",
                        "clock": "simulated", "device_slug": "cpu", "budget_kv_bytes": gb * 1e9, "eviction": policy,
                        "host_kv_gb": None, "prefix_hit_rate": base + bump, "prefix_hit_rate_ideal": 0.77,
                        "ttft_ms_p50": 1000 / (base + bump), "run_dir": f"r{gb}{policy}"})
        out.append({**out[-1], "eviction": "lru", "host_kv_gb": 64.0, "prefix_hit_rate": 0.76, "ttft_ms_p50": 900,
                    "run_dir": f"r{gb}host"})
    # a workload without reuse: no place in these figures
    out.append({"scenario": "capacity", "status": "ok", "model": "m", "workload": "chat", "budget_kv_bytes": 1e9,
                "prefix_hit_rate": 0.0, "prefix_hit_rate_ideal": 0.0, "run_dir": "chat"})
    return pd.DataFrame(out)


def test_only_runs_with_reuse_are_drawn_with_policy_and_tier_named():
    df = reuse_rows(_rows())
    assert len(df) == 9 and set(df["line"]) == {"lru", "2q", "lru + 64 GB host"}
    assert list(reuse_table(_rows())["kv_gb"])[:3] == [20.0, 20.0, 20.0]


def test_both_figures_draw_a_line_or_point_per_policy_and_tier_and_the_ideal():
    with theme():
        fig = hit_rate_vs_cache(_rows())
        (ax,) = [a for a in fig.axes if a.has_data()]
        labels = [line.get_label() for line in ax.get_lines()]
        assert labels[:3] == ["2q", "lru", "lru + 64 GB host"] and labels[3].startswith("ideal")
        assert list(ax.get_lines()[1].get_ydata()) == [10.0, 30.0, 50.0]  # lru's hit rate in %, by size
        ttft = ttft_vs_hit_rate(_rows())
        assert len([a for a in ttft.axes if a.has_data()]) == 1


def test_no_figure_without_reuse_or_with_one_size():
    only_chat = _rows().tail(1)
    assert hit_rate_vs_cache(only_chat) is None and ttft_vs_hit_rate(only_chat) is None
    one_size = _rows()[_rows()["budget_kv_bytes"] == 20e9]
    assert hit_rate_vs_cache(one_size) is None
