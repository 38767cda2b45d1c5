"""Other systems' benchmark JSON in the report: rows beside kvbench's own, and one line per file it cannot read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvbench.harness.report import build_report
from kvbench.harness.report.collect import collect
from kvbench.harness.results import write_run
from kvbench.harness.results.vllm_json import write_vllm_results
from kvbench.harness.serving.timeline import requests_table
from tests.helpers.vllm_rows import FIGURES, FIXTURE, SEQS, decode_row

KVBENCH = {"scenario": "decode", "status": "ok", "impl": "paged_torch", "model": "tiny-llama", "batch": 8,
           "device_slug": "cpu-test", "arrival": "poisson", "request_rate": 2.0, "ttft_ms_mean": 30.0,
           "normalized_latency_s": 0.02, "achieved_rps": 1.9, "clock": "wall"}
AIPERF = {
    "request_throughput": {"unit": "requests/sec", "avg": 13.16},
    "request_latency": {"unit": "ms", "avg": 6550.4, "p50": 5799.9, "p90": 8594.2, "p99": 9381.6, "std": 1171.1},
    "time_to_first_token": {"unit": "s", "avg": 1.5888, "p50": 0.7875, "p99": 4.1193},
    "inter_token_latency": {"unit": "ms", "avg": 51.76, "p50": 51.98, "p99": 55.87},
    "output_token_throughput": {"unit": "tokens/sec", "avg": 1274.6},
    "benchmark_duration": {"unit": "sec", "avg": 15.1966},
    "total_isl": {"unit": "tokens", "avg": 110000.0},
    "total_osl": {"unit": "tokens", "avg": 19370.0},
    "input_config": {"endpoint": {"model_names": ["openai/gpt-oss-20b"], "type": "chat"}},
}


# What ``vllm bench serve --metadata device=cpu-test batch=8`` adds to its file: the run's machine and batch.
RUN = {"device": "cpu-test", "batch": "8"}


def vllm_result(**change) -> dict:
    """The fixture's vLLM result, with the machine and batch the import needs, and ``change``."""
    return {**json.loads(FIXTURE.read_text()), **RUN, **change}


def results_folder(root: Path) -> Path:
    write_run(root / "cpu-test" / "decode" / "0", [KVBENCH])
    (root / "external" / "vllm").mkdir(parents=True)
    (root / "external" / "vllm" / "llama-2qps.json").write_text(json.dumps(vllm_result()))
    return root


def test_a_vllm_file_is_a_row_beside_kvbenchs_own(tmp_path):
    rows = collect([results_folder(tmp_path / "results")]).rows.set_index("impl")
    assert list(rows.index) == ["paged_torch", "vllm"]
    vllm = rows.loc["vllm"]
    assert (vllm["source"], vllm["scenario"], vllm["status"], vllm["arrival"]) == ("external", "decode", "ok", "poisson")
    assert vllm["run_dir"] == "results/external/vllm/llama-2qps.json"
    assert vllm["ttft_ms_mean"] == pytest.approx(48.175) and vllm["duration_s"] == pytest.approx(2.5561)
    assert vllm["normalized_latency_s"] == pytest.approx(0.0124, abs=1e-4) and vllm["request_rate"] == 2.0
    assert "vllm bench serve" in vllm["notes"] and rows.loc["paged_torch"]["source"] != "external"


def test_a_kvbench_runs_json_read_as_external_gives_the_runs_figures(tmp_path):
    row = {**decode_row(), "device_slug": "cpu-test", "batch": 4}
    ext = tmp_path / "results" / "external" / "kvbench"
    ext.mkdir(parents=True)
    write_vllm_results(ext, [row], requests_table(SEQS, "paged_torch", "r"), burstiness=1.0)
    (back,) = collect([tmp_path / "results"]).rows.to_dict("records")
    for col in FIGURES:
        assert back[col] == pytest.approx(row[col]) if not isinstance(row[col], str) else back[col] == row[col], col
    assert (back["impl"], back["source"]) == ("kvbench", "external")
    assert (back["device_slug"], back["batch"]) == ("cpu-test", 4)  # written as vLLM's metadata, read back


def test_vllms_append_result_file_is_one_row_per_line(tmp_path):
    one = vllm_result()
    folder = tmp_path / "r" / "external" / "sglang"
    folder.mkdir(parents=True)
    (folder / "sweep.json").write_text(json.dumps(one) + "\n" + json.dumps({**one, "request_rate": 8.0}) + "\n")
    rows = collect([tmp_path / "r"]).rows
    assert list(rows["request_rate"]) == [2.0, 8.0] and set(rows["impl"]) == {"sglang"}
    assert list(rows["run_dir"]) == ["r/external/sglang/sweep.json#1", "r/external/sglang/sweep.json#2"]


def test_an_aiperf_export_is_read_in_kvbench_units(tmp_path):
    folder = tmp_path / "r" / "external" / "dynamo"
    folder.mkdir(parents=True)
    (folder / "profile_export_aiperf.json").write_text(json.dumps(AIPERF))
    (row,) = collect([tmp_path / "r"]).rows.to_dict("records")
    assert row["ttft_ms_mean"] == pytest.approx(1588.8) and row["ttft_ms_p99"] == pytest.approx(4119.3)  # s -> ms
    assert row["tpot_ms_p50"] == pytest.approx(51.98)  # AIPerf's inter_token_latency is kvbench's TPOT
    assert row["e2el_ms_p90"] == pytest.approx(8594.2) and row["duration_s"] == pytest.approx(15.1966)
    assert row["achieved_rps"] == pytest.approx(13.16) and row["output_tokens"] == 19370
    assert row["model"] == "openai/gpt-oss-20b" and row["source"] == "external" and row["itl_ms_mean"] != row["itl_ms_mean"]


BAD = {
    "truncated.json": '{"duration": 1.0, "completed": ',
    "text.json": "this is not JSON",
    "array.json": "[1, 2, 3]",
    "other.json": '{"hello": "world"}',
    "wrong-type.json": json.dumps({**json.loads(FIXTURE.read_text()), "mean_tpot_ms": "12 ms"}),
    "unit.json": json.dumps({**AIPERF, "time_to_first_token": {"unit": "fortnights", "avg": 1.0}}),
    "half-token.json": json.dumps({**AIPERF, "total_osl": {"unit": "tokens", "avg": 10.5}}),
    "deep.json": "[" * 100_000 + "]" * 100_000,
    "huge-int.json": '{"duration": 1, "completed": ' + "9" * 5000 + "}",
    "code.json": '{"duration": __import__("os").system("touch pwned"), "completed": 1}',
}


def test_each_bad_file_is_one_line_naming_it_and_the_report_goes_on(tmp_path):
    root = results_folder(tmp_path / "results")
    for name, text in BAD.items():
        (root / "external" / "vllm" / name).write_text(text)
    (root / "external" / "vllm" / "binary.json").write_bytes(b"\xff\xfe\x00garbage")
    col = collect([root])
    assert sorted(col.rows["impl"]) == ["paged_torch", "vllm"]  # the good file is still read
    lines = col.warnings()
    assert len(lines) == len(BAD) + 1
    for name in [*BAD, "binary.json"]:
        (line,) = [ln for ln in lines if f"/{name}:" in ln]
        assert "\n" not in line and len(line) < 300, line
    by_name = {ln.split(": ", 1)[0].rsplit("/", 1)[1]: ln for ln in lines}
    assert "mean_tpot_ms: expected a number" in by_name["wrong-type.json"]
    assert "fortnights" in by_name["unit.json"] and "neither" in by_name["other.json"]
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


def test_the_report_draws_and_tabulates_external_rows(tmp_path):
    root = results_folder(tmp_path / "results")
    report = build_report([root], tmp_path / "out", "python -m harness.report results")
    assert set(report.collection.rows["impl"]) == {"paged_torch", "vllm"}
    assert "external" in (tmp_path / "out" / "all_runs.csv").read_text()


def _aiperf(**change) -> dict:
    from kvbench.harness.report.external import from_aiperf

    return from_aiperf({**AIPERF, **change})


@pytest.mark.parametrize("change, clauses", [
    # the reproducer: negative averages, and the row said ok (the clause shows the row's unit)
    ({"time_to_first_token": {"unit": "s", "avg": -1.5888, "p50": 0.7875, "p99": 4.1193},
      "request_latency": {"unit": "ms", "avg": -6550.4}},
     ["time_to_first_token.avg in ms = -1588.8: a time, allowed >= 0", "request_latency.avg = -6550.4: a time"]),
    ({"output_token_throughput": {"unit": "tokens/sec", "avg": -1274.6}},
     ["output_token_throughput.avg = -1274.6: a rate"]),
    ({"total_osl": {"unit": "tokens", "avg": -19370}}, ["total_osl.avg = -19370: a count, allowed >= 0"]),
    ({"benchmark_duration": {"unit": "ms", "avg": -15196.6}}, ["benchmark_duration.avg in s = -15.1966: a time"]),
    ({"inter_token_latency": {"unit": "ms", "avg": 51.76, "p99": float("nan")}},
     ["inter_token_latency.p99 = nan: allowed a finite number"]),
    ({"total_isl": {"unit": "tokens", "avg": float("inf")}}, ["total_isl.avg = inf: allowed a finite number"]),
    # the other family of failure, in the other format: a percentile below the one under it
    ({"request_latency": {"unit": "ms", "avg": 6550.4, "p50": 5799.9, "p90": 5000.0, "p99": 9381.6}},
     ["request_latency.p90 = 5000 < request_latency.p50 = 5799.9: a higher percentile, "
      "allowed >= request_latency.p50"]),
])
def test_an_aiperf_figure_out_of_range_or_order_is_an_error_row_naming_its_key(change, clauses):
    row = _aiperf(**change)
    assert row["status"] == "error" and "\n" not in row["error"]
    for clause in clauses:
        assert clause in row["error"], (clause, row["error"])
    assert all(not (isinstance(v, float) and (v != v or v in (float("inf"), float("-inf")))) for v in row.values())


def test_an_aiperf_export_as_it_is_stays_ok():
    row = _aiperf()
    assert row["status"] == "ok" and row.get("error") is None


@pytest.mark.parametrize("change, names", [
    ({"total_osl": {"unit": "tokens", "avg": 10.5}}, "total_osl.avg: expected a whole number"),
    ({"time_to_first_token": {"unit": "s", "avg": 10**400}},
     "time_to_first_token.avg: expected a number a float holds"),
    ({"time_to_first_token": {"unit": "s", "avg": "1.5"}}, "time_to_first_token.avg: expected a number"),
])
def test_an_aiperf_value_of_the_wrong_kind_is_still_one_problem_line(change, names):
    from kvbench.harness.report.external import ExternalFileError

    with pytest.raises(ExternalFileError, match=f"^{names}"):
        _aiperf(**change)


def test_false_figures_of_either_format_are_rows_not_ok_in_the_report(tmp_path):
    from kvbench.harness.report.markdown import render

    root = tmp_path / "r"
    (root / "external" / "vllm").mkdir(parents=True)
    (root / "external" / "dynamo").mkdir(parents=True)
    vllm = vllm_result(duration=-2.5561, request_throughput=-1.56, mean_ttft_ms=-48.2)
    (root / "external" / "vllm" / "negative.json").write_text(json.dumps(vllm))
    (root / "external" / "dynamo" / "profile_export_aiperf.json").write_text(
        json.dumps({**AIPERF, "request_latency": {"unit": "ms", "avg": -6550.4}}))
    col = collect([root])
    assert col.warnings() == []  # read, as rows: not problem lines
    rows = col.rows.set_index("impl")
    assert list(rows["status"]) == ["error", "error"]
    assert rows.loc["vllm", "error"].startswith("duration = -2.5561: a time, allowed >= 0")
    assert "request_latency.avg = -6550.4" in rows.loc["dynamo", "error"]
    text = render(col, [], "python -m harness.report r", {})
    listed = text.split("Rows not ok:", 1)[1]
    assert "duration = -2.5561" in listed and "request_latency.avg = -6550.4" in listed
