"""harness.report.palette: one fixed colour and marker per impl, one legend per figure, and the audit that checks both."""

from __future__ import annotations

import os
import subprocess
import sys

import matplotlib
import matplotlib.pyplot as plt
import pandas as pd
import pytest

from kvbench.harness.paths import CONF_DIR, REPO_ROOT
from kvbench.harness.report.figures import impl_palette
from kvbench.harness.report.palette import (
    DASHES, FALLBACK_COLOURS, FALLBACK_MARKERS, KNOWN, KNOWN_IMPLS, dash_entries, drawn_impls, figure_legend,
    figure_problems, impl_lines, impl_order, impl_style, legend_labels,
)


def test_every_impl_in_conf_has_a_fixed_style_and_no_other():
    assert set(KNOWN_IMPLS) == {p.stem for p in (CONF_DIR / "impl").glob("*.yaml")}


def test_known_impls_have_distinct_colours_and_markers():
    styles = [impl_style(name) for name in KNOWN_IMPLS]
    assert len({s.colour.lower() for s in styles}) == len(styles)
    assert len({s.marker for s in styles}) == len(styles)


def test_fallback_never_takes_a_known_impls_colour_or_marker():
    assert not {c.lower() for c in FALLBACK_COLOURS} & {s.colour.lower() for s in KNOWN.values()}
    assert not set(FALLBACK_MARKERS) & {s.marker for s in KNOWN.values()}
    for name in ("vllm", "sglang", "tgi", "lmdeploy", "x"):
        assert impl_style(name).colour in FALLBACK_COLOURS and impl_style(name).marker in FALLBACK_MARKERS


def test_styles_are_fixed_whatever_else_the_report_holds():
    """The old palette numbered the impls present: contiguous changed colour when another impl joined."""
    assert impl_style("contiguous").colour == "#0173B2" and impl_style("contiguous").marker == "o"
    alone = impl_palette(["paged_cuda"])
    crowd = impl_palette(list(KNOWN_IMPLS) + ["vllm"])
    assert alone["paged_cuda"] == crowd["paged_cuda"] == impl_style("paged_cuda").colour
    assert impl_palette(["vllm"])["vllm"] == crowd["vllm"]


def test_colours_are_seaborns_colourblind_palette_by_fixed_place():
    """Each impl's colour is a fixed place in seaborn's palette; the hexes are pinned here so a seaborn
    release that changed them would show, not silently recolour every figure from one report to the next."""
    import seaborn as sns

    colourblind = [c.upper() for c in sns.color_palette("colorblind").as_hex()]
    assert {name: s.colour for name, s in KNOWN.items()} == {
        "contiguous": "#0173B2", "orca_max": "#56B4E9", "orca_pow2": "#CC78BC", "orca_oracle": "#CA9161",
        "paged": "#591E71", "paged_torch": "#DE8F05", "paged_triton": "#029E73", "paged_cuda": "#D55E00",
        "paged_flex": "#000000"}
    dark = [c.upper() for c in sns.color_palette("dark").as_hex()]
    # paged: the dark palette's purple; paged_flex: black
    assert {s.colour for s in KNOWN.values()} - set(colourblind) == {dark[4], "#000000"}
    # light pink and yellow (faint on white), grey (the dash entries' colour): no impl's
    assert not {colourblind[6], colourblind[7], colourblind[8]} & {s.colour for s in KNOWN.values()}
    assert FALLBACK_COLOURS == ("#8C0800", "#592F0D", "#A23582", "#B8850A", "#006374", "#001C7F")
    assert set(FALLBACK_COLOURS) <= set(dark)


def test_an_unknown_name_keeps_its_style_in_another_process():
    """From the name's CRC-32, not Python's per-process string hash."""
    code = "from kvbench.harness.report.palette import impl_style; s = impl_style('vllm'); print(s.colour, s.marker)"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == [impl_style("vllm").colour, impl_style("vllm").marker]


def test_legend_order_known_first_then_others_alphabetically():
    assert impl_order(["vllm", "paged_cuda", "contiguous", "aphrodite", None]) == [
        "contiguous", "paged_cuda", "aphrodite", "vllm"]


def _two_panels(left: list[str], right: list[str]):
    fig, axes = plt.subplots(1, 2)
    for ax, impls in zip(axes, (left, right)):
        if not impls:
            continue
        df = pd.DataFrame([{"impl": i, "x": x, "y": x * (k + 1)} for k, i in enumerate(impls) for x in (1, 2)])
        impl_lines(ax, df, "x", "y")
    return fig, axes


def test_figure_legend_names_every_impl_of_every_panel():
    fig, axes = _two_panels(["contiguous", "paged_torch"], ["orca_pow2", "vllm"])
    figure_legend(fig, drawn_impls(fig))
    labels = legend_labels(fig)
    assert [lbl for lbl in labels if lbl != "impl"] == ["contiguous", "orca_pow2", "paged_torch", "vllm"]
    assert figure_problems(fig) == []
    plt.close(fig)


def test_audit_finds_an_impl_missing_from_the_legend_an_empty_panel_and_a_wrong_colour():
    fig, axes = _two_panels(["contiguous"], ["orca_pow2"])
    figure_legend(fig, ["contiguous"])  # built from one panel, as the old figures did
    fig.add_subplot(2, 2, 4)  # a panel with nothing in it
    axes[0].plot([1, 2], [1, 2], color="red", marker="o", label="paged_cuda")
    problems = figure_problems(fig)
    assert any("orca_pow2 is in no legend" in p for p in problems)
    assert any("is empty" in p for p in problems)
    assert any("paged_cuda drawn in #ff0000" in p for p in problems)
    plt.close(fig)


def test_impl_lines_mean_with_min_max_bars_and_dashes_by_order():
    df = pd.DataFrame({"impl": "paged_torch", "x": [1, 1, 2, 2, 1], "y": [1.0, 3.0, 5.0, 5.0, 9.0],
                       "mode": ["eager", "eager", "eager", "eager", "CUDA graphs"]})
    fig, ax = plt.subplots()
    impl_lines(ax, df, "x", "y", dash_by="mode", dash_order=["eager", "CUDA graphs"])
    eager, graphs = [ln for ln in ax.lines if ln.get_label() == "paged_torch"]  # not the bars' caps
    assert list(eager.get_ydata()) == [2.0, 5.0] and eager.get_linestyle() == "-"
    assert graphs.get_linestyle() != "-" and list(graphs.get_ydata()) == [9.0]
    assert len(ax.collections) == 1  # one set of bars: only eager at x=1 has runs that differ
    assert eager.get_marker() == graphs.get_marker() == impl_style("paged_torch").marker
    entries = dash_entries(["CUDA graphs"], ["eager", "CUDA graphs"])
    assert entries[0].get_linestyle() == graphs.get_linestyle()  # the legend's dashes are the line's
    plt.close(fig)


def test_a_value_outside_the_dash_order_is_drawn_solid():
    df = pd.DataFrame({"impl": "contiguous", "x": [1, 2], "y": [1.0, 2.0], "batch": [float("nan")] * 2})
    fig, ax = plt.subplots()
    impl_lines(ax, df, "x", "y", dash_by="batch", dash_order=[])
    assert [ln.get_linestyle() for ln in ax.lines] == ["-"] and DASHES[0] == "-"
    plt.close(fig)


@pytest.mark.parametrize("name", KNOWN_IMPLS)
def test_legend_handle_is_the_impls_own(name):
    fig, _ = _two_panels([name], [])
    legend = figure_legend(fig, [name])
    handle = legend.legend_handles[1]  # after the "impl" header
    assert handle.get_marker() == impl_style(name).marker
    assert matplotlib.colors.to_hex(handle.get_color()).lower() == impl_style(name).colour.lower()
    plt.close(fig)
