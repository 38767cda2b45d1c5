"""harness.report end to end: a run flagged ``contended`` (the machine busy) is drawn, marked, and tabulated;
an imported vLLM result with its device and batch is drawn beside kvbench's own rows."""

from __future__ import annotations

import json

import pytest

from kvbench.harness.report import build_report
from kvbench.harness.report.__main__ import main
from kvbench.harness.report.page_one import FLAG
from kvbench.harness.report.palette import FLAGGED_LABEL, drawn_impls, legend_labels
from kvbench.harness.results import write_run
from tests.helpers.vllm_rows import FIXTURE

ENV = {"status": "ok", "device": "cpu", "device_slug": "cpu-test", "model": "tiny-llama", "workload": "chat",
       "scenario": "decode", "arrival": "burst"}


def runs(root, contended_batch: int | None = 8):
    for impl, base in (("contiguous", 100.0), ("paged_torch", 120.0)):
        for batch in (1, 8):
            write_run(root / "cpu-test" / "decode" / f"{impl}-{batch}",
                      [{**ENV, "impl": impl, "batch": batch, "output_tokens_per_s": base * batch,
                        "contended": impl == "paged_torch" and batch == contended_batch}])
    return root


def test_a_flagged_run_is_drawn_ringed_named_and_marked_in_the_tables(tmp_path):
    report = build_report([runs(tmp_path / "results")], tmp_path / "out", "cmd")
    fig = report.figures["decode_throughput"]
    assert {"contiguous", "paged_torch"} <= drawn_impls(fig) and FLAGGED_LABEL in legend_labels(fig)
    md = (tmp_path / "out" / "REPORT.md").read_text()
    assert "## Rows measured under contention" in md and "drawn like the others" in md
    assert f"paged_torch{FLAG}" in md.split("## 1. Decode throughput vs batch")[1]  # the decode table marks it


def test_without_flagged_rows_no_ring_is_drawn(tmp_path):
    report = build_report([runs(tmp_path / "results", contended_batch=None)], tmp_path / "out", "cmd")
    assert FLAGGED_LABEL not in legend_labels(report.figures["decode_throughput"])
    assert "## Rows measured under contention" not in (tmp_path / "out" / "REPORT.md").read_text()


def _vllm(root, **run):
    folder = root / "external" / "vllm"
    folder.mkdir(parents=True)
    for n, rate_batch in enumerate((1, 8)):
        one = {**json.loads(FIXTURE.read_text()), "request_rate": "inf", "burstiness": 1.0, **run}
        if "batch" in run:
            one["batch"] = str(rate_batch)
        (folder / f"b{rate_batch}.json").write_text(json.dumps(one))


def test_an_imported_vllm_result_with_its_device_and_batch_is_drawn_beside_kvbenchs(tmp_path):
    root = runs(tmp_path / "results", contended_batch=None)
    _vllm(root, device="cpu-test", batch="set per file", workload="chat", model_id="tiny-llama")
    report = build_report([root], tmp_path / "out", "cmd")
    vllm = report.collection.rows[report.collection.rows["impl"] == "vllm"]
    assert sorted(vllm["batch"]) == [1, 8] and set(vllm["device_slug"]) == {"cpu-test"}
    fig = report.figures["decode_throughput"]
    assert len(fig.axes) == 1 and "vllm" in drawn_impls(fig)  # the same panel as kvbench's own rows


def test_a_vllm_result_without_device_or_batch_asks_for_them(tmp_path, capsys):
    root = runs(tmp_path / "results", contended_batch=None)
    _vllm(root)
    assert main([str(root), "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert err.count("records no device and batch") == 2
    assert "--metadata device=<slug> batch=<n>" in err and "--external-device SLUG --external-batch N" in err
    assert main([str(root), "--out", str(tmp_path / "out2"), "--external-device", "cpu-test",
                 "--external-batch", "8"]) == 0
    assert "records no" not in capsys.readouterr().err
    import pandas as pd

    rows = pd.read_parquet(tmp_path / "out2" / "all_runs.parquet")
    assert list(rows.loc[rows["impl"] == "vllm", "batch"]) == [8, 8]


@pytest.mark.parametrize("flag, value", [("--external-batch", "0"), ("--external-batch", "many"),
                                         ("--external-device", " ")])
def test_a_bad_external_default_is_a_usage_error(tmp_path, capsys, flag, value):
    root = runs(tmp_path / "results", contended_batch=None)
    with pytest.raises(SystemExit) as exit_:
        main([str(root), flag, value])
    assert exit_.value.code == 2 and flag in capsys.readouterr().err
