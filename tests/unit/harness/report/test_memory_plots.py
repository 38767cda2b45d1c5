"""harness.report.memory_plots: which settings plot 1 shows, in what order, and how it names the others."""

from __future__ import annotations

import re

import matplotlib
import matplotlib.pyplot as plt
import pandas as pd
import pytest

from kvbench.harness.report import memory_plots
from kvbench.harness.report.memory_plots import (
    MORE_FACETS, max_concurrency, memory_panels, memory_vs_concurrency, memory_vs_concurrency_more,
)
from kvbench.harness.report.palette import figure_problems, impl_style

BUDGET_13B = 7746076672.0
SWEEP = (1, 2, 4, 8, 16, 32, 64, 128)  # as strings they sort 1, 128, 16, 2, ...


def points(run: str, model: str, workload: str, block: int, budget: float, per_request_gb: float) -> list[dict]:
    return [{"run_dir": run, "run_id": run, "concurrency": c, "variant": v, "model": model, "workload": workload,
             "dtype": "float16", "block_size": block, "max_seq_len": 2048, "n": 1, "shared_prefix_len": 0,
             "budget_kv_bytes": budget, "device_slug": "cpu-test", "kv_bytes_used": c * 0.2e9 * per_request_gb,
             "kv_bytes_reserved": c * 1e9 * per_request_gb * (1.0 if v == "contiguous" else 0.25 + block / 1000)}
            for c in (1, 8, 64, 100, 256) for v in ("contiguous", "paged", "paged_shared")]


def setting() -> tuple[pd.DataFrame, pd.DataFrame]:
    """The seeds' experiment, a 13B block-size sweep on ShareGPT and one 13B Alpaca run, in a jumbled order."""
    pts, rows = [], []
    for block in reversed(SWEEP):
        run = f"sweep/{block}"
        pts += points(run, "llama-2-13b", "sharegpt", block, BUDGET_13B, 0.8)
        rows.append({"run_dir": run, "prompt_len": 161.31, "output_len": 337.99, "batch": 256})
    pts += points("alpaca", "llama-2-13b", "alpaca", 16, BUDGET_13B, 0.8)
    rows.append({"run_dir": "alpaca", "prompt_len": 19.31, "output_len": 58.45, "batch": 256})
    pts += points("seeds", "llama-2-7b", "seeds", 16, 111.66e9, 1.07)
    rows.append({"run_dir": "seeds", "prompt_len": 100.0, "output_len": 400.0, "batch": 100})
    return pd.DataFrame(pts), pd.DataFrame(rows)


def _blocks(fig) -> list[int]:
    return [int(re.search(r"block (\d+)", ax.get_title()).group(1)) for ax in fig.axes]


def test_the_seeds_experiment_comes_first_and_the_sweep_waits_for_the_second_figure():
    fig, _ = memory_vs_concurrency(*setting())
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[0].startswith("llama-2-7b · seeds") and "the seeds' experiment" in titles[0]
    assert len(titles) == 3 and _blocks(fig) == [16, 16, 16]  # seeds, then 13B alpaca and sharegpt at block 16
    assert "paging saves" in " ".join(t.get_text() for t in fig.axes[0].texts)
    plt.close(fig)


def test_the_other_settings_have_their_own_figure_with_block_sizes_in_numeric_order():
    fig, left = memory_vs_concurrency_more(*setting())
    assert _blocks(fig) == [b for b in SWEEP if b != 16]
    assert left == []
    plt.close(fig)


def test_left_out_settings_are_named_for_a_reader():
    _, notes = memory_vs_concurrency(*setting())
    assert len(notes) == len(SWEEP) - 1
    assert notes[0] == "llama-2-13b · sharegpt · float16 · max_seq_len 2048 · block 1 · KV budget 7.75 GB (past the panels shown)"
    assert [int(re.search(r"block (\d+)", n).group(1)) for n in notes] == [1, 2, 4, 8, 32, 64, 128]
    assert not any("|" in n or str(int(BUDGET_13B)) in n or "nan" in n for n in notes)


def test_beyond_the_second_figure_the_rest_are_named(monkeypatch):
    monkeypatch.setattr(memory_plots, "MORE_FACETS", 3)
    main, more, left = memory_panels(*setting())
    assert [p["block_size"].iloc[0] for p in more] == [1, 2, 4] and len(left) == 4 and "block 128" in left[-1]
    fig, named = memory_vs_concurrency_more(*setting())
    assert len(fig.axes) == 3 and named == left
    plt.close(fig)
    assert MORE_FACETS >= len(SWEEP)  # the published sweep fits the second figure whole


def test_without_any_panel_at_the_default_block_size_the_main_figure_takes_the_sweep():
    pts, rows = setting()
    keep = pts["model"] == "llama-2-13b"
    keep &= pts["block_size"] != 16
    fig, _ = memory_vs_concurrency(pts[keep], rows)
    assert _blocks(fig) == [1, 2, 4, 8, 32, 64]
    plt.close(fig)


@pytest.mark.parametrize("make", [memory_vs_concurrency, memory_vs_concurrency_more])
def test_variants_wear_their_impls_colours_and_every_line_is_named(make):
    fig, _ = make(*setting())
    assert figure_problems(fig) == []
    contiguous = [ln for ax in fig.axes for ln in ax.lines if ln.get_label().startswith("contiguous")]
    assert contiguous and all(ln.get_color() == impl_style("contiguous").colour for ln in contiguous)
    plt.close(fig)


def test_max_concurrency_bars_in_each_impls_colour():
    base = {"scenario": "max_concurrency", "status": "ok", "model": "m", "workload": "fixed", "device_slug": "d",
            "batch": 64}
    rows = pd.DataFrame([{**base, "impl": impl, "max_concurrency": m, "max_concurrency_analytic": a}
                         for impl, m, a in (("paged_torch", 40, 41), ("contiguous", 9, 9), ("orca_pow2", 20, 22))])
    fig = max_concurrency(rows)
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["contiguous", "orca_pow2", "paged_torch"]
    measured = {bars.get_label(): bars.patches[0] for bars in ax.containers if not bars.get_label().startswith("_")}
    for impl, bar in measured.items():
        assert matplotlib.colors.to_hex(bar.get_facecolor()).lower() == impl_style(impl).colour.lower()
    assert sorted(p.get_height() for p in ax.patches) == [9, 9, 20, 22, 40, 41]
    assert figure_problems(fig) == []
    plt.close(fig)
