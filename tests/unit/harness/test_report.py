"""harness.report on synthetic run folders from two GPUs: tables, plots, REPORT.md."""

from __future__ import annotations

import math
import runpy
import sys
from pathlib import Path

import pandas as pd
import pytest

from kvbench.harness.report import build_report
from kvbench.harness.report.__main__ import main
from kvbench.harness.report.hardware import table_peak_tbps
from kvbench.harness.report.tables import md_table
from kvbench.harness.report.palette import drawn_impls, figure_problems, legend_labels
from kvbench.harness.results import write_run

GPUS = {
    "nvidia-h100-80gb-hbm3": {"gpu_name": "NVIDIA H100 80GB HBM3", "speed": 1.0, "peak_bw_gbps": None},
    "nvidia-h200": {"gpu_name": "NVIDIA H200", "speed": 1.4, "peak_bw_gbps": 4800.0},
}
PLOTS = ["memory_vs_concurrency", "kv_breakdown", "max_concurrency", "decode_throughput",
         "kernel_latency_bandwidth", "gpu_comparison"]


def env(slug: str) -> dict:
    return {"device": "cuda", "device_slug": slug, "gpu_name": GPUS[slug]["gpu_name"], "cpu_name": "Test CPU",
            "torch_version": "2.11.0", "triton_version": "3.6.0", "git_sha": "abc123", "status": "ok"}


def decode_rows(slug: str) -> list[dict]:
    rows = []
    for impl, base in (("contiguous", 100.0), ("paged_triton", 130.0)):
        for batch in (1, 4, 16):
            rows.append({**env(slug), "run_id": f"dec-{slug}", "scenario": "decode", "impl": impl, "model": "llama-3-8b",
                         "workload": "chat", "batch": batch,
                         "output_tokens_per_s": base * batch * GPUS[slug]["speed"], "tokens_per_s": 4 * base * batch,
                         "step_ms_p50": 20.0, "ttft_ms_p50": None if batch == 4 else 50.0,  # missing metric
                         "kv_bytes_reserved": 2_000_000, "kv_bytes_used": 500_000 if impl == "contiguous" else 1_900_000,
                         "kv_fragmentation_bytes": 0 if impl == "contiguous" else 100_000,
                         "kv_reservation_waste_bytes": 1_500_000 if impl == "contiguous" else 0,
                         "kv_used_fraction": 0.25 if impl == "contiguous" else 0.95})
    if slug == "nvidia-h100-80gb-hbm3":  # a job that failed: kept in the table, left out of plots
        rows.append({**env(slug), "run_id": f"dec-{slug}", "scenario": "decode", "impl": "paged_cuda",
                     "model": "llama-3-8b", "workload": "chat", "batch": 16, "status": "oom",
                     "error": "CUDA out of memory"})
    return rows


def kernel_rows(slug: str) -> list[dict]:
    rows = []
    for impl, layout, block in (("contiguous", "contiguous", None), ("paged_triton", "paged", 16),
                                ("paged_triton", "paged", 32)):
        for ctx in (128, 1024, 4096):
            bw = GPUS[slug]["speed"] * (900 + ctx / 4) * (0.8 if layout == "paged" else 1.0)
            rows.append({**env(slug), "run_id": f"ker-{slug}", "scenario": "kernel", "impl": impl, "kernel": impl,
                         "layout": layout, "dtype": "bfloat16", "block_size": block, "kernel_batch": 16,
                         "context_len": ctx, "num_heads": 32, "num_kv_heads": 8, "head_dim": 128,
                         "latency_us_p50": ctx / bw * 50, "latency_us_p10": ctx / bw * 45,
                         "latency_us_p90": ctx / bw * 60, "bandwidth_gbps": bw,
                         "peak_bw_gbps": GPUS[slug]["peak_bw_gbps"], "copy_bw_gbps": 4300.0 if slug == "nvidia-h200" else None,
                         "frac_peak_bw": bw / 4800 if slug == "nvidia-h200" else None, "frac_copy_bw": None})
    return rows


def capacity_rows() -> list[dict]:
    common = {**env("nvidia-h200"), "scenario": "capacity", "model": "llama-2-7b", "workload": "fixed", "batch": 100,
              "max_seq_len": 2048, "prompt_len": 100, "output_len": 400, "budget_kv_bytes": 112e9}
    return [
        {**common, "run_id": "0", "impl": "contiguous", "kv_bytes_reserved": 107e9, "kv_bytes_used": 26e9,
         "kv_fragmentation_bytes": 0, "kv_reservation_waste_bytes": 81e9, "kv_used_fraction": 26 / 107,
         "max_concurrency": 100, "max_concurrency_analytic": 104},
        {**common, "run_id": "1", "impl": "paged_triton", "kv_bytes_reserved": 26.8e9, "kv_bytes_used": 26e9,
         "kv_fragmentation_bytes": 0.8e9, "kv_reservation_waste_bytes": 0, "kv_used_fraction": 26 / 26.8,
         "max_concurrency": 100, "max_concurrency_analytic": 419},
    ]


def points_table() -> pd.DataFrame:
    rows = []
    for n in (1, 8, 64, 100, 256):
        for variant, per_req in (("contiguous", 1.07e9), ("paged", 0.268e9), ("paged_shared", 0.2e9)):
            rows.append({"concurrency": n, "variant": variant, "model": "llama-2-7b", "dtype": "float16",
                         "block_size": 16, "max_seq_len": 2048, "workload": "fixed", "n": 1, "shared_prefix_len": 0,
                         "kv_bytes_reserved": n * per_req, "kv_bytes_used": n * 0.26e9, "budget_kv_bytes": 112e9,
                         "device_slug": "nvidia-h200", "run_id": "0"})
    return pd.DataFrame(rows)


def make_runs(root: Path) -> None:
    for slug in GPUS:
        write_run(root / slug / "decode", decode_rows(slug))
        write_run(root / slug / "kernel", kernel_rows(slug))
    (root / "nvidia-h200" / "decode" / ".hydra").mkdir()
    (root / "nvidia-h200" / "decode" / ".hydra" / "overrides.yaml").write_text("- +impl=contiguous,paged_triton\n- batch=1\n")
    sweep = root / "nvidia-h200" / "capacity"
    for i, row in enumerate(capacity_rows()):
        write_run(sweep / str(i), [row], {"points": points_table()})
    (sweep / "multirun.yaml").write_text(
        "hydra:\n  overrides:\n    hydra:\n    - hydra.sweep.dir=results/cap\n    - hydra.mode=MULTIRUN\n"
        "    task:\n    - scenario=capacity\n    - +impl=contiguous,paged_triton\n")
    mc = root / "nvidia-h200" / "maxconc"  # written as CSV only: the fallback reader
    write_run(mc, [{**env("nvidia-h200"), "scenario": "max_concurrency", "impl": impl, "model": "llama-2-7b",
                    "workload": "fixed", "max_concurrency": m, "max_concurrency_analytic": a, "probes": 7}
                   for impl, m, a in (("contiguous", 98, 104), ("paged_triton", 402, 419))])
    (mc / "rows.parquet").unlink()


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    make_runs(root)
    return build_report([root], root, f"python -m harness.report {root}")


def test_table_has_both_gpus_failed_rows_and_empty_metrics(report):
    df = pd.read_parquet(report.out / "all_runs.parquet")
    assert set(df["device_slug"]) == set(GPUS)
    assert (report.out / "all_runs.csv").exists() and (report.out / "all_points.parquet").exists()
    assert set(df["scenario"]) == {"decode", "kernel", "capacity", "max_concurrency"}
    failed = df[df["status"] != "ok"]
    assert len(failed) == 1 and failed.iloc[0]["status"] == "oom" and "out of memory" in failed.iloc[0]["error"]
    assert failed["output_tokens_per_s"].isna().all()  # a failed row measured nothing: empty, not 0
    missing = df[(df["scenario"] == "decode") & (df["batch"] == 4)]["ttft_ms_p50"]
    assert len(missing) == 4 and missing.isna().all()
    assert df[df["scenario"] == "decode"]["nvml_used_bytes"].isna().all()
    assert df[df["scenario"] == "kernel"]["frac_copy_bw"].isna().all()
    csv = pd.read_csv(report.out / "all_runs.csv")
    assert csv[(csv["scenario"] == "decode") & (csv["batch"] == 4)]["ttft_ms_p50"].isna().all()
    assert (df["run_dir"].str.count("/") >= 1).all()


def test_every_plot_written(report):
    assert sorted(report.figures) == sorted(PLOTS)
    for name in PLOTS:
        for ext in ("png", "svg"):
            path = report.out / "plots" / f"{name}.{ext}"
            assert path.exists() and path.stat().st_size > 1000, path


def test_gpu_comparison_has_one_facet_per_gpu(report):
    fig = report.figures["gpu_comparison"]
    titles = [ax.get_title() for ax in fig.axes]
    for slug in GPUS:
        facets = [t for t in titles if t.startswith(slug)]
        assert len(facets) == 4  # decode raw + per TB/s, kernel GB/s + fraction of peak
    assert len(fig.axes) == 4 * len(GPUS)
    assert all(ax.lines for ax in fig.axes)
    # H100 has no peak_bw_gbps in its rows: the datasheet table supplies 3.35 TB/s
    assert any("3.35 TB/s" in t for t in titles) and any("4.8 TB/s" in t for t in titles)


def test_every_figure_draws_each_impl_in_its_own_style_and_names_it(report):
    """One colour and marker per impl in every figure, each named by the figure's legend (or its bars' ticks),
    and no panel left empty."""
    for name, fig in report.figures.items():
        assert figure_problems(fig) == [], name


def test_failed_rows_not_plotted(report):
    fig = report.figures["decode_throughput"]
    labels = legend_labels(fig)
    assert "contiguous" in labels and "paged_cuda" not in labels
    assert "paged_cuda" not in drawn_impls(fig)


def test_max_concurrency_prefers_search_rows(report):
    fig = report.figures["max_concurrency"]
    heights = sorted(p.get_height() for ax in fig.axes for p in ax.patches if p.get_height() > 0)
    assert heights == [98, 104, 402, 419]  # the search's rows, not the capacity rows (100 / 100)


def test_report_md_embeds_plots_and_commands(report):
    md = (report.out / "REPORT.md").read_text()
    for name in PLOTS:
        assert f"](plots/{name}.png)" in md and f"(plots/{name}.svg)" in md
    assert f"python -m harness.report {report.out}" in md
    assert "python -m harness +impl=contiguous,paged_triton batch=1\n" in md
    assert "python -m harness -m scenario=capacity +impl=contiguous,paged_triton hydra.sweep.dir=results/cap\n" in md
    assert "NVIDIA H100 80GB HBM3" in md and "NVIDIA H200" in md
    assert "CUDA out of memory" in md


def test_cli_draws_only_what_has_data(tmp_path, capsys):
    write_run(tmp_path / "runs" / "d", decode_rows("nvidia-h200"))
    out = tmp_path / "out"
    stale = out / "plots" / "gpu_comparison.png"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"old")
    assert main([str(tmp_path / "runs"), "--out", str(out)]) == 0
    written = sorted(p.name for p in (out / "plots").iterdir())
    assert written == ["decode_throughput.png", "decode_throughput.svg", "kv_breakdown.png", "kv_breakdown.svg"]
    md = (out / "REPORT.md").read_text()
    assert f"python -m harness.report {tmp_path / 'runs'} --out {out}" in md
    assert "memory_vs_concurrency" not in md and not (out / "all_points.parquet").exists()


def test_cli_without_runs_fails(tmp_path):
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty")]) == 1


def test_module_entry_point(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["python -m harness.report", "--help"])
    monkeypatch.delitem(sys.modules, "kvbench.harness.report.__main__", raising=False)  # imported above: run it afresh
    with pytest.raises(SystemExit) as exit_:
        runpy.run_module("kvbench.harness.report", run_name="__main__")
    assert exit_.value.code == 0 and "--out" in capsys.readouterr().out


def test_peak_bandwidth_table():
    assert table_peak_tbps("NVIDIA H100 80GB HBM3") == 3.35
    assert table_peak_tbps("nvidia-h200") == 4.8
    assert table_peak_tbps("NVIDIA A100 80GB PCIe") == 1.935  # conf/gpu/a100-80gb-pcie.yaml
    assert table_peak_tbps("NVIDIA A100-SXM4-80GB") == 2.039
    assert table_peak_tbps("NVIDIA H100 PCIe") == 2.0 and table_peak_tbps("NVIDIA H100 NVL") == 3.9
    assert table_peak_tbps("NVIDIA GeForce RTX 4090") == 1.008
    assert math.isnan(table_peak_tbps("Tesla T4")) and math.isnan(table_peak_tbps(None))


def test_md_table():
    t = md_table(pd.DataFrame({"a": [1.0, float("nan")], "b": ["x|y", None]}))
    assert t.splitlines() == ["| a | b |", "| --- | --- |", "| 1 | x\\|y |", "| – | – |"]


def test_parity_table_flags_disagreeing_impls():
    import pandas as pd

    from kvbench.harness.report.parity import parity_table

    base = {"scenario": "decode", "status": "ok", "device_slug": "cpu", "model": "m", "dtype": "float32",
            "workload": "chat", "workload_digest": "w1", "batch": 8}
    rows = pd.DataFrame([{**base, "impl": "contiguous", "output_digest": "aaa"},
                         {**base, "impl": "paged_torch", "output_digest": "aaa"},
                         {**base, "batch": 16, "impl": "contiguous", "output_digest": "aaa"},
                         {**base, "batch": 16, "impl": "paged_triton", "output_digest": "bbb"}])
    table = parity_table(rows).set_index("batch")
    assert bool(table.loc[8, "agree"]) and not bool(table.loc[16, "agree"])


def test_breakdown_adds_external_fragmentation_only_where_an_impl_has_it():
    from kvbench.harness.report.memory_plots import breakdown_table, kv_breakdown

    rows = pd.DataFrame(capacity_rows())  # written before the column existed: none
    labels = [t.get_text() for t in kv_breakdown(rows).legends[0].texts]
    assert labels == ["token states", "internal fragmentation", "reservation waste"]
    oracle = {**capacity_rows()[0], "run_id": "2", "impl": "orca_oracle", "kv_bytes_reserved": 30e9,
              "kv_bytes_used": 26e9, "kv_reservation_waste_bytes": 4e9, "kv_external_fragmentation_bytes": 10e9}
    rows = pd.DataFrame([*capacity_rows(), oracle])
    table = breakdown_table(rows).set_index("impl")
    assert table.at["contiguous", "kv_external_fragmentation_bytes"] == 0
    assert table.at["orca_oracle", "held_bytes"] == 40e9  # token states + waste + stranded free memory
    assert table.at["orca_oracle", "used_pct"] == 65
    labels = [t.get_text() for t in kv_breakdown(rows).legends[0].texts]
    assert labels[-1] == "external fragmentation"


def test_capacity_bars_are_one_per_setting_whichever_machines_ran_them():
    """KV accounting does not depend on the device: two machines' capacity rows of one setting are one bar group
    (the published breakdown drew each twice, 5,827 px tall), while decode rows stay per device."""
    from kvbench.harness.report.memory_plots import breakdown_table
    from kvbench.harness.report.selection import ANY_DEVICE

    one = capacity_rows()
    other = [{**r, "device_slug": "cpu-other-2core", "run_id": r["run_id"] + "b"} for r in one]
    table = breakdown_table(pd.DataFrame([*one, *other]))
    assert len(table) == len(one) and set(table["device_slug"]) == {ANY_DEVICE}
    assert table.equals(breakdown_table(pd.DataFrame(one)))


def test_eager_and_graphed_decode_rows_stay_apart():
    """cuda_graph=true rows are another measurement of the same impl: the decode table names the
    mode, parity compares within a mode, and the plot draws them as separate lines."""
    from kvbench.harness.report.selection import with_mode
    from kvbench.harness.report.markdown import decode_table
    from kvbench.harness.report.parity import parity_table
    from kvbench.harness.report.speed_plots import decode_throughput

    base = {"scenario": "decode", "status": "ok", "device_slug": "nvidia-h200", "model": "m", "dtype": "bfloat16",
            "workload": "chat", "workload_digest": "w1", "kv_used_fraction": 0.5, "run_dir": "r"}
    rows = pd.DataFrame([
        {**base, "impl": impl, "batch": b, "cuda_graph": graphs, "output_digest": digest,
         "output_tokens_per_s": (300.0 if graphs else 100.0) * b}
        for impl in ("contiguous", "paged_triton") for b in (1, 64)
        for graphs, digest in ((False, "eager"), (True, "graphed"))])
    assert list(with_mode(rows)["mode"].unique()) == ["eager", "CUDA graphs"]
    assert set(with_mode(rows.drop(columns="cuda_graph"))["mode"]) == {"eager"}  # rows from before the switch

    table, _ = decode_table(rows)
    assert table.groupby(["impl", "mode", "batch"]).size().eq(1).all() and len(table) == 8

    parity = parity_table(rows)
    assert len(parity) == 4 and parity["agree"].all()  # each mode agrees across impls; modes never mixed

    fig = decode_throughput(rows, {"contiguous": "C0", "paged_triton": "C1"})
    (ax,) = [a for a in fig.axes if a.lines]
    ys = [[float(y) for y in line.get_ydata()] for line in ax.lines]
    tops = sorted(round(max(y)) for y in ys if len(y) == 2 and not any(math.isnan(v) for v in y))
    assert set(tops) == {6400, 19200}  # eager and graphed lines; averaged together they would top at 12800


def test_compiled_cpu_decode_rows_are_their_own_mode():
    """cpu_compile=true rows (the dense work compiled by inductor) are another measurement of the impl:
    labelled ``compiled``, kept apart in the table and the plot; a CSV's "True"/"False" text reads the same."""
    from kvbench.harness.report.selection import with_mode
    from kvbench.harness.report.markdown import decode_table
    from kvbench.harness.report.speed_plots import decode_throughput

    base = {"scenario": "decode", "status": "ok", "device_slug": "cpu-x", "model": "m", "dtype": "float32",
            "workload": "fixed", "workload_digest": "w1", "impl": "paged_cuda", "run_dir": "r", "cuda_graph": False,
            "kv_used_fraction": 0.5}
    rows = pd.DataFrame([{**base, "batch": b, "cpu_compile": flag, "output_tokens_per_s": (1.2 if flag == "True" else 1.0) * b}
                         for flag in ("False", "True", None) for b in (8, 32)])
    assert list(with_mode(rows)["mode"]) == ["eager", "eager", "compiled", "compiled", "eager", "eager"]
    table, _ = decode_table(rows.iloc[:4])
    assert sorted(table["mode"]) == ["compiled", "compiled", "eager", "eager"]
    (ax,) = [a for a in decode_throughput(rows.iloc[:4], {"paged_cuda": "C1"}).axes if a.lines]
    styles = {round(max(line.get_ydata())): line.get_linestyle() for line in ax.lines
              if line.get_linestyle() != "None" and len(line.get_ydata()) == 2}
    assert styles[32] == "-" and styles[38] != "-"  # eager solid, compiled dashed


def test_eager_lines_stay_solid_whichever_rows_come_first():
    from kvbench.harness.report.speed_plots import decode_throughput

    base = {"scenario": "decode", "status": "ok", "device_slug": "nvidia-h200", "model": "m", "dtype": "bfloat16",
            "workload": "chat", "impl": "paged_triton"}
    rows = pd.DataFrame([{**base, "batch": b, "cuda_graph": graphs, "output_tokens_per_s": (3.0 if graphs else 1.0) * b}
                         for graphs in (True, False) for b in (1, 64)])  # graphed rows first
    (ax,) = [a for a in decode_throughput(rows, {"paged_triton": "C1"}).axes if a.lines]
    styles = {round(max(line.get_ydata())): line.get_linestyle() for line in ax.lines  # not the caps' markers
              if line.get_linestyle() != "None" and len(line.get_ydata()) == 2}
    assert styles[64] == "-" and styles[192] != "-"  # eager solid, CUDA graphs dashed


def test_the_pure_torch_reference_is_marked_wherever_its_speed_is_shown():
    from kvbench.harness.report.markdown import REFERENCE_NOTE, _section_table, as_reference
    from kvbench.harness.report.collect import Collection

    t = as_reference(pd.DataFrame({"impl": ["contiguous", "paged_torch", "paged_cuda"]}))
    assert t["impl"].tolist() == ["contiguous", "paged_torch (reference)", "paged_cuda"]
    rows = pd.DataFrame([{"scenario": "decode", "status": "ok", "device_slug": "cpu", "model": "m", "workload": "w",
                          "impl": "paged_torch", "batch": 8, "output_tokens_per_s": 10.0, "kv_used_fraction": 0.5,
                          "run_dir": "r"}])
    text = _section_table("decode_throughput", Collection(rows, pd.DataFrame()), 0.05)
    assert text.startswith(REFERENCE_NOTE) and "paged_torch (reference)" in text


def test_the_regenerate_command_is_the_same_however_the_folders_are_spelt():
    """REPORT.md's command does not change with a trailing slash or the default folder named: regenerating the
    published report with the README's command or `make report` leaves REPORT.md as it was."""
    from kvbench.harness.report import regenerate_command

    spellings = {regenerate_command(a) for a in (["results"], ["results/"], ["./results"])}
    assert spellings == {"python -m harness.report results"}  # the published sets: not the default, named
    assert {regenerate_command(a) for a in ([], ["runs"], ["runs/"], ["./runs"])} == {"python -m harness.report"}
    assert regenerate_command(["runs/", "--out", "x/"]) == "python -m harness.report runs --out x"
