"""harness.report.figures: labels a person reads (no "gpu=?", no 10^-2), and the defaults it assumes."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from omegaconf import OmegaConf

from kvbench.harness.paths import CONF_DIR
from kvbench.harness.report.figures import DEFAULT_BLOCK_SIZE, facet_labels, log_axis, show


def test_default_block_size_is_the_configs():
    assert DEFAULT_BLOCK_SIZE == OmegaConf.load(CONF_DIR / "config.yaml")["block_size"]


def test_a_column_that_does_not_apply_is_left_out_of_the_label():
    df = pd.DataFrame({"model": ["m", "m"], "clock": ["wall", "simulated"], "gpu": [None, "1x a100-40gb"]})
    labels = list(facet_labels(df, ["model", "clock", "gpu"]))
    assert labels == ["wall clock", "simulated clock · GPU 1x a100-40gb"]
    assert "?" not in " ".join(labels)


def test_budgets_read_in_gb():
    assert show("budget_kv_bytes", 7746076672.0) == "KV budget 7.75 GB"


def test_log_axis_labels_are_plain_numbers():
    fig, ax = plt.subplots()
    ax.plot([1, 2], [0.003, 5.0])
    log_axis(ax)
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert "0.01" in labels and "1" in labels
    assert not any("10^" in t or "times" in t or "$" in t for t in labels)
    plt.close(fig)


def _two_figures():
    import matplotlib.pyplot as plt

    figs = {}
    for name, ys in (("a", [1, 3, 2]), ("b", [5, 4, 6])):
        fig, ax = plt.subplots()
        ax.plot([0, 1, 2], ys, label=name)
        ax.legend()
        figs[name] = fig
    return figs


def test_save_all_writes_the_pngs_save_writes_and_the_same_files_every_time(tmp_path):
    """The PNGs come from a second process: the same bytes as drawing them here; the SVGs the same each run."""
    from kvbench.harness.report.figures import save, save_all, theme

    with theme():
        got = save_all(_two_figures(), tmp_path / "all")
        again = save_all(_two_figures(), tmp_path / "again")
        for name, fig in _two_figures().items():
            save(fig, tmp_path / "one", name)
    assert [p.name for p in got] == ["a.png", "a.svg", "b.png", "b.svg"] and all(p.stat().st_size for p in got)
    for name in ("a.png", "b.png"):
        assert (tmp_path / "all" / name).read_bytes() == (tmp_path / "one" / name).read_bytes()
    for p in got:
        assert p.read_bytes() == (tmp_path / "again" / p.name).read_bytes()


def test_save_all_draws_the_pngs_itself_when_a_figure_cannot_be_pickled(tmp_path, monkeypatch):
    import pickle

    from kvbench.harness.report.figures import save_all, theme

    def refuse(*a, **k):
        raise pickle.PicklingError("an artist that does not pickle")

    monkeypatch.setattr(pickle, "dumps", refuse)
    with theme():
        got = save_all(_two_figures(), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "a.svg", "b.png", "b.svg"]
    assert all(p.stat().st_size for p in got)


def _drawn(tmp_path, name: str, left: float) -> bytes:
    """One plot with a clip box and markers, its axes' left edge at ``left``, saved as the report saves."""
    import re

    from kvbench.harness.report.figures import save, theme

    with theme():
        fig = plt.figure(figsize=(4, 3))
        ax = fig.add_axes((left, 0.15, 0.8, 0.75))
        ax.plot([1, 2, 3], [3, 1, 2], marker="o")
        ax.bar([1.5], [1.0], hatch="//")
        save(fig, tmp_path, name)
    text = (tmp_path / f"{name}.svg").read_text()
    ids = set(re.findall(r'id="([^"]+)"', text))
    refs = set(re.findall(r"url\(#([^)]+)\)", text)) | set(re.findall(r'xlink:href="#([^"]+)"', text))
    assert refs and refs <= ids  # every clip path, marker and hatch a part names is in the file
    return text.encode()


def test_an_svg_is_the_same_file_when_its_layout_moves_by_less_than_it_prints(tmp_path):
    # matplotlib names a clip path by a hash of its full-precision box: axes 1e-13 of the figure apart drew
    # the same picture to every printed digit and came out with other names (a published plot "changed")
    assert _drawn(tmp_path, "a", 0.15) == _drawn(tmp_path, "b", 0.15 + 1e-13)
    assert _drawn(tmp_path, "c", 0.15) != _drawn(tmp_path, "d", 0.2)


def test_svg_ids_are_renamed_by_first_appearance():
    from kvbench.harness.report.figures import stable_svg_ids

    text = '<g clip-path="url(#p0123456789)"/><use xlink:href="#m9876543210"/><clipPath id="p0123456789"/>'
    text += '<path clip-path="url(#pabcdefabcd)"/><path id="m9876543210"/>'
    assert stable_svg_ids(text) == (
        '<g clip-path="url(#clip0)"/><use xlink:href="#marker0"/><clipPath id="clip0"/>'
        '<path clip-path="url(#clip1)"/><path id="marker0"/>'
    )
