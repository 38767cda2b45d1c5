"""Report images stay readable on one screen, and a panel of one point becomes a table row."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from PIL import Image

from kvbench.harness.report.figures import MAX_PIXELS, SAVE_DPI, png_dpi, save, single_point_facets, theme


def test_a_large_figure_is_saved_at_most_max_pixels_a_side(tmp_path):
    with theme():
        big = plt.figure(figsize=(22.4, 12.6))
        big.add_subplot().plot([0, 1], [0, 1])
        small = plt.figure(figsize=(6.0, 4.0))
        small.add_subplot().plot([0, 1], [0, 1])
        assert png_dpi(small) == SAVE_DPI and png_dpi(big) < SAVE_DPI
        save(big, tmp_path, "big")
        save(small, tmp_path, "small")
    assert max(Image.open(tmp_path / "big.png").size) <= MAX_PIXELS
    assert Image.open(tmp_path / "small.png").size == (6 * SAVE_DPI, 4 * SAVE_DPI)  # as before: not enlarged


def test_facets_at_one_x_are_the_single_point_ones():
    df = pd.DataFrame({"facet": ["a", "a", "b", "b", "c"], "batch": [1, 8, 8, 8, 4]})
    assert single_point_facets(df, "facet", "batch") == ["b", "c"]
    assert single_point_facets(df.iloc[0:0], "facet", "batch") == []
