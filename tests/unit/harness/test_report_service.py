"""harness.report on hand-built service runs: latency and goodput vs rate, KV over time, the max-rate table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvbench.harness.report import build_report
from kvbench.harness.report.collect import numeric
from kvbench.harness.report.palette import figure_problems, legend_labels
from kvbench.harness.report.service_plots import max_rate_table
from kvbench.harness.results import write_run

ENV = {"device": "cpu", "device_slug": "cpu-test", "cpu_name": "Test CPU", "torch_version": "2.11.0",
       "git_sha": "abc123", "status": "ok", "model": "tiny-llama", "workload": "chat", "dtype": "float32",
       "batch": 8}
RATES = (1.0, 2.0, 4.0)
# seconds per token: paged stays flat where contiguous saturates (the paper's Figure 12 shape)
NORM = {"contiguous": {1.0: 0.05, 2.0: 0.08, 4.0: 0.40}, "paged_torch": {1.0: 0.05, 2.0: 0.06, 4.0: 0.09}}
RESERVED = {"contiguous": 8_000_000, "paged_torch": 2_000_000}  # bytes held at rate 4, distinct per impl


def service_row(impl: str, rate: float, run: str) -> dict:
    return {**ENV, "run_id": run, "scenario": "decode", "impl": impl, "arrival": "poisson", "request_rate": rate,
            "achieved_rps": 0.97 * rate, "duration_s": 8 / rate, "idle_s": 0.1, "clock": "wall", "slo": "cpu-test",
            "ttft_ms_p99": 100 * rate, "tpot_ms_p99": 20.0, "normalized_latency_s": NORM[impl][rate],
            "goodput_rps": rate if NORM[impl][rate] < 0.2 else 0.2 * rate, "slo_attainment": 0.9,
            "slo_pass": NORM[impl][rate] < 0.2, "tokens_per_s_spread": 0.0, "output_tokens_per_s": 50.0 * rate}


def steps_table(impl: str, rate: float, run: str) -> pd.DataFrame:
    t = np.linspace(0, 8 / rate, 20)
    scale = rate / max(RATES)  # the busiest run holds the most memory
    used = (np.sin(t) ** 2 + 0.1) * 1_000_000 * scale
    return pd.DataFrame({"impl": impl, "run_id": run, "t_s": t, "kind": ["prefill"] + ["decode"] * 19,
                         "batch": 4, "tokens": 4, "running": 4, "waiting": 0, "kv_used_bytes": used,
                         "kv_reserved_bytes": RESERVED[impl] * scale, "preemptions": 0})


def make_service_runs(root: Path) -> None:
    for i, rate in enumerate(RATES):
        run = f"rate{i}"
        impls = list(NORM)
        steps = pd.concat([steps_table(impl, rate, run) for impl in impls], ignore_index=True)
        write_run(root / "decode" / str(i), [service_row(impl, rate, run) for impl in impls], {"steps": steps})
    # A burst run that (against the contract) records a rate: still left out of the rate plots.
    burst = {**service_row("contiguous", 1.0, "burst"), "arrival": "burst", "request_rate": 100.0,
             "normalized_latency_s": 9.0, "goodput_rps": 50.0}
    write_run(root / "decode" / "burst", [burst])
    probes = pd.DataFrame([{"impl": impl, "rate_rps": r, "slo_pass": ok, "normalized_latency_s": 0.1,
                            "goodput_rps": r, "ttft_ms_p99": 10.0, "tpot_ms_p99": 5.0, "run_id": "mr"}
                           for impl, rates in (("contiguous", ((1, True), (2, True), (4, False))),
                                               ("paged_torch", ((4, True), (8, False), (5, True))))
                           for r, ok in rates])
    write_run(root / "max_rate", [{**ENV, "run_id": "mr", "scenario": "max_rate", "impl": impl, "slo": "cpu-test",
                                   "arrival": "poisson", "max_rate_rps": rate, "probes": 3}
                                  for impl, rate in (("contiguous", 2.0), ("paged_torch", 5.0))],
              {"rate_probes": probes})


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("service")
    make_service_runs(root)
    out = tmp_path_factory.mktemp("out")
    return build_report([root], out, "python -m harness.report service")


def test_service_plots_written(report):
    for name in ("normalized_latency", "goodput", "kv_over_time"):
        assert name in report.figures
        for ext in ("png", "svg"):
            path = report.out / "plots" / f"{name}.{ext}"
            assert path.exists() and path.stat().st_size > 1000, path
    assert (report.out / "all_rate_probes.parquet").exists()


def _data(ax) -> list:
    """A panel's data lines: each is labelled with its impl (reference lines' labels start with _)."""
    return [ln for ln in ax.lines if not ln.get_label().startswith("_")]


def _lines(fig) -> dict[str, tuple[list, list]]:
    """Each impl's line in the (single) panel, x and y, by its label."""
    return {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ln in _data(fig.axes[0])}


def test_normalized_latency_vs_rate_skips_burst(report):
    lines = _lines(report.figures["normalized_latency"])
    assert set(lines) == set(NORM)
    for impl, (x, y) in lines.items():
        assert x == list(RATES)  # the burst row's rate of 100 is not drawn
        assert y == pytest.approx([NORM[impl][r] for r in RATES])


def test_goodput_vs_rate(report):
    lines = _lines(report.figures["goodput"])
    assert lines["contiguous"][1] == pytest.approx([1.0, 2.0, 0.8])
    assert lines["paged_torch"][1] == pytest.approx(list(RATES))


def test_kv_over_time_draws_the_busiest_run_per_impl(report):
    fig = report.figures["kv_over_time"]
    ax = fig.axes[0]
    assert {"contiguous", "paged_torch"} <= set(legend_labels(fig)) and "4 req/s" in ax.get_title()
    reserved_mb = sorted(round(max(ln.get_ydata()), 3) for ln in ax.lines if ln.get_linestyle() == "--"
                         and len(ln.get_xdata()) > 1)
    assert reserved_mb == [2.0, 8.0]  # MB held by paged_torch and contiguous at 4 req/s, not at a lower rate


def test_every_figure_draws_each_impl_in_its_own_style_and_names_it(report):
    """One colour and marker per impl in every figure, each named by the figure's legend (or its bars' ticks),
    and no panel left empty."""
    for name, fig in report.figures.items():
        assert figure_problems(fig) == [], name


def test_max_rate_table_ratio_to_contiguous(report):
    md = (report.out / "REPORT.md").read_text()
    assert "## Max request rate under the SLO" in md
    rows = {ln.split("|")[7].strip(): ln for ln in md.splitlines() if ln.startswith("| cpu-test | tiny-llama | chat")
            and "×" in ln}
    assert set(rows) == {"contiguous", "paged_torch"}
    assert "| 2.50× |" in rows["paged_torch"] and "| 5 |" in rows["paged_torch"]
    assert "| 1.00× |" in rows["contiguous"]
    for name in ("normalized_latency", "goodput", "kv_over_time"):
        assert f"](plots/{name}.png)" in md


def test_max_rate_ratio_needs_contiguous_in_the_same_setting():
    base = {**ENV, "scenario": "max_rate", "arrival": "poisson", "slo": "s", "run_dir": "r"}
    rows = pd.DataFrame([{**base, "impl": "contiguous", "max_rate_rps": 2.0},
                         {**base, "impl": "paged_torch", "max_rate_rps": 6.0},
                         {**base, "model": "other", "impl": "paged_torch", "max_rate_rps": 3.0}])
    t = max_rate_table(rows).set_index(["model", "impl"])["ratio"]
    assert t[("tiny-llama", "paged_torch")] == pytest.approx(3.0)
    assert pd.isna(t[("other", "paged_torch")])  # no contiguous run of that model: no ratio


def test_slo_pass_read_back_from_csv_as_bool():
    df = numeric(pd.DataFrame({"slo_pass": ["True", "False", None], "request_rate": ["2.5", "", "x"]}))
    assert df["slo_pass"].tolist()[:2] == [True, False] and pd.isna(df["slo_pass"].iloc[2])
    assert df["request_rate"].iloc[0] == 2.5 and df["request_rate"].iloc[1:].isna().all()


def test_no_service_sections_without_service_data(tmp_path):
    write_run(tmp_path / "runs" / "d", [{**ENV, "scenario": "decode", "impl": "contiguous",
                                          "output_tokens_per_s": 10.0, "tokens_per_s": 20.0}])
    report = build_report([tmp_path / "runs"], tmp_path / "out", "cmd")
    assert not {"normalized_latency", "goodput", "kv_over_time"} & set(report.figures)
    md = (tmp_path / "out" / "REPORT.md").read_text()
    assert "Max request rate" not in md and "Normalized latency" not in md
    assert not (tmp_path / "out" / "all_rate_probes.csv").exists()


def test_throughput_figure_uses_only_burst_rows(report):
    from kvbench.harness.report.markdown import decode_table

    table, _ = decode_table(report.collection.rows)
    # the burst run alone; rows under Poisson arrivals are limited by their rate
    assert table["output tok/s"].tolist() == ["50"] or table["output tok/s"].astype(float).tolist() == [50.0]
    # one batch, one point: a table row, not a figure of one dot
    assert "decode_throughput" not in report.figures


def test_max_rate_markdown_names_the_simulated_gpu():
    # A planning sweep's rows differ only in gpu.count: without the column, its lines are indistinguishable.
    from kvbench.harness.report.markdown import max_rate_markdown

    base = {**ENV, "scenario": "max_rate", "arrival": "poisson", "slo": "s", "run_dir": "r", "clock": "simulated"}
    rows = pd.DataFrame([{**base, "gpu": g, "impl": i, "max_rate_rps": r}
                         for g, i, r in (("2x h200", "contiguous", 7.5), ("2x h200", "paged_torch", 17.0),
                                         ("4x h200", "contiguous", 31.0), ("4x h200", "paged_torch", 31.0))])
    md = max_rate_markdown(rows)
    assert "| simulated GPU |" in md
    assert "| paged_torch | 2x h200 | 17 | 2.27× |" in md and "| paged_torch | 4x h200 | 31 | 1.00× |" in md
    wall = max_rate_markdown(rows.drop(columns=["gpu", "clock"]).head(2))
    assert "simulated GPU" not in wall  # wall-clock rows keep the table as it was


def test_normalized_latency_keeps_simulated_and_wall_clock_rows_apart(tmp_path):
    """Simulated-GPU rows (capacity, clock=simulated) run on the same machine as wall-clock ones: the table
    names the clock and GPU of each row, and the figure draws them in separate panels, never averaged."""
    norm = {"wall": 0.5, "simulated": 0.02}
    for clock, scenario, gpu in (("wall", "decode", None), ("simulated", "capacity", "1x a100-40gb")):
        write_run(tmp_path / "runs" / clock, [
            {**service_row("paged_torch", rate, clock), "scenario": scenario, "clock": clock, "gpu": gpu,
             "normalized_latency_s": norm[clock]} for rate in RATES])
    report = build_report([tmp_path / "runs"], tmp_path / "out", "cmd")
    md = (tmp_path / "out" / "REPORT.md").read_text()
    section = md.split(". Normalized latency vs request rate\n")[1].split("\n## ")[0]
    header = next(ln for ln in section.splitlines() if ln.startswith("| device |"))
    assert "| clock | simulated GPU | impl |" in header
    body = [ln for ln in section.splitlines() if ln.startswith("| cpu-test |")]
    assert sum("| wall | – |" in ln for ln in body) == 3 and sum("| simulated | 1x a100-40gb |" in ln for ln in body) == 3
    fig = report.figures["normalized_latency"]
    drawn = {ax.get_title(): sorted({round(y, 6) for ln in _data(ax) for y in ln.get_ydata()})
             for ax in fig.axes if ax.lines}
    assert len(drawn) == 2 and sorted(drawn.values()) == [[0.02], [0.5]]  # one panel per clock, each its own values
    assert any("simulated" in t and "a100" in t for t in drawn) and any("wall" in t for t in drawn)
    wall_only = build_report([tmp_path / "runs" / "wall"], tmp_path / "out_wall", "cmd")
    text = (tmp_path / "out_wall" / "REPORT.md").read_text()
    assert "| clock | impl |" in text and "simulated GPU" not in text and "normalized_latency" in wall_only.figures
