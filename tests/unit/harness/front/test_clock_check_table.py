"""The error table's arithmetic: signed and absolute errors, medians by metric, GPU and split."""

import csv

import pytest

from kvbench.harness.front.clock_check_points import load_points
from kvbench.harness.front.clock_check_price import Priced
from kvbench.harness.front.clock_check_table import Result, markdown, signed_error_pct, summarize, write_csv


def _results(sims):
    points = load_points()[:len(sims)]
    return [Result(p, Priced(None if s is None else p.value * s, "cmd", "no conf" if s is None else "", 3))
            for p, s in zip(points, sims)]


def test_signed_error_is_relative_to_the_published_figure():
    assert signed_error_pct(90.0, 100.0) == pytest.approx(-10.0)
    assert signed_error_pct(125.0, 100.0) == pytest.approx(25.0)


def test_medians_by_group_worked_by_hand():
    # the set's first four rows: TensorRT-LLM's 8B output tok/s on one H100, splits fit, fit, holdout, fit
    results = _results([0.8, 1.1, 0.5, None])
    lines = {(g.by, g.key): g for g in summarize(results)}
    everything = lines[("all", "all")]
    assert everything.count == 3  # the unpriced point is in no median
    assert everything.median_abs_pct == pytest.approx(20.0)  # |-20|, |+10|, |-50| -> 20
    assert everything.median_signed_pct == pytest.approx(-20.0)
    assert lines[("split", "fit")].median_abs_pct == pytest.approx(15.0)  # -20 and +10
    assert lines[("split", "holdout")].median_signed_pct == pytest.approx(-50.0)
    assert lines[("gpu", "h100-sxm")].count == 3 and lines[("metric", "output_tok_s")].count == 3


def test_nothing_priced_gives_no_lines_and_the_markdown_names_each_unpriced_point(tmp_path):
    results = _results([None, 1.0])
    assert summarize(_results([None])) == []
    text = markdown(results, "# header")
    assert "Priced 1 of 2 points." in text and f"`{results[0].point.id}`: no conf" in text
    assert "| **all** | 1 | 0.0% | +0.0% |" in text
    write_csv(results, tmp_path / "errors.csv")
    rows = list(csv.DictReader(open(tmp_path / "errors.csv")))
    assert rows[0]["simulated"] == "" and rows[0]["reason"] == "no conf"
    assert rows[1]["error_pct"] == "0.0" and rows[1]["abs_error_pct"] == "0.0"
