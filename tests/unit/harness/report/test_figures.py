"""harness.report.figures: labels a person reads (no "gpu=?", no 10^-2), and the defaults it assumes."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from omegaconf import OmegaConf

from harness.paths import CONF_DIR
from harness.report.figures import DEFAULT_BLOCK_SIZE, facet_labels, log_axis, show


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
