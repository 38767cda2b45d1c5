"""A point measured while the machine was busy is drawn, ringed, and named in the legend: never dropped."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from kvbench.harness.report.palette import (FLAGGED_ARTIST, FLAGGED_LABEL, figure_legend, figure_problems,
                                            impl_lines, legend_labels)


def _rows(contended) -> pd.DataFrame:
    return pd.DataFrame({"impl": ["contiguous"] * 3, "batch": [1, 8, 8], "tps": [10.0, 70.0, 90.0],
                         "contended": contended})


def _rings(ax) -> list[tuple[list, list]]:
    return [(list(ln.get_xdata()), list(ln.get_ydata())) for ln in ax.lines if ln.get_label() == FLAGGED_ARTIST]


def test_a_flagged_row_is_drawn_and_its_point_ringed_and_named():
    fig, ax = plt.subplots()
    drawn = impl_lines(ax, _rows([False, False, True]), "batch", "tps")
    figure_legend(fig, drawn)
    assert _rings(ax) == [([8], [80.0])]  # the point the flagged row is part of, at its mean
    line = next(ln for ln in ax.lines if ln.get_label() == "contiguous")
    assert list(line.get_xdata()) == [1, 8]  # the flagged row stays in the line
    assert FLAGGED_LABEL in legend_labels(fig) and figure_problems(fig) == []
    plt.close(fig)


def test_without_a_flagged_row_there_is_no_ring_and_no_legend_entry():
    for contended in ([False, False, False], [None, None, None]):
        fig, ax = plt.subplots()
        figure_legend(fig, impl_lines(ax, _rows(pd.array(contended, dtype="boolean")), "batch", "tps"))
        assert _rings(ax) == [] and FLAGGED_LABEL not in legend_labels(fig)
        plt.close(fig)
    fig, ax = plt.subplots()
    impl_lines(ax, _rows([True] * 3).drop(columns="contended"), "batch", "tps")  # rows from before the column
    assert _rings(ax) == []
    plt.close(fig)
