"""vLLM's result JSON both ways: a kvbench row to it and back gives the same figures, in vLLM's units."""

from __future__ import annotations

import json
import statistics

import numpy as np
import pytest

from kvbench.harness.config import ArrivalConfig
from kvbench.harness.results.vllm_json import KEYS, VllmJsonError, from_vllm, result_name, to_vllm, write_vllm_results
from kvbench.harness.serving.timeline import requests_table
from tests.helpers.vllm_rows import FIGURES, FIXTURE, SEQS, decode_row, seq


def test_a_kvbench_row_round_trips_into_the_same_figures(tmp_path):
    row, table = decode_row(), requests_table(SEQS, "paged_torch", "r")
    (path,) = write_vllm_results(tmp_path, [row], table, burstiness=1.0)
    assert path.name == "vllm-paged_torch.json"
    result = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))
    assert list(result) == list(KEYS)  # vLLM's keys, in vLLM's order
    back = from_vllm(result)
    for col in FIGURES:
        assert row[col] is not None and col in back, col
        assert back[col] == pytest.approx(row[col]) if not isinstance(row[col], str) else back[col] == row[col], col


def test_units_are_vllms_ms_for_summaries_and_seconds_for_lists():
    result = to_vllm(decode_row(), requests_table(SEQS, "paged_torch", "r"), burstiness=1.0)
    ttfts = [s.first_token_s - s.arrival_s for s in SEQS]  # s
    assert result["ttfts"] == pytest.approx(ttfts)
    assert result["latencies"] == pytest.approx([s.finish_s - s.arrival_s for s in SEQS])
    assert result["start_times"] == pytest.approx([s.arrival_s for s in SEQS])
    assert result["mean_ttft_ms"] == pytest.approx(1e3 * statistics.fmean(ttfts))  # ms
    assert result["std_ttft_ms"] == pytest.approx(1e3 * np.std(ttfts))  # vLLM's np.std: the population's
    assert result["duration"] == pytest.approx(1.10)  # s
    assert result["input_lens"] == [5, 8, 3] and result["output_lens"] == [4, 3, 5]
    assert result["completed"] == 3 and result["failed"] == 0 and result["num_prompts"] == 3
    assert result["date"] == "20250612-101530" and result["backend"] == "kvbench-paged_torch"
    assert (result["request_rate"], result["burstiness"]) == (2.0, 1.0)


def test_what_kvbench_did_not_measure_stays_null():
    result = to_vllm(decode_row(), requests_table(SEQS, "paged_torch", "r"))
    for key in ("tokenizer_id", "max_concurrency", "itls", "queue_times", "generated_texts", "errors",
                "max_output_tokens_per_s", "max_concurrent_requests", "rtfx", "std_itl_ms"):
        assert result[key] is None, key
    bare = to_vllm(decode_row())  # timeline_tables=false: no per-request table
    assert all(bare[k] is None for k in ("input_lens", "ttfts", "latencies", "std_ttft_ms", "std_e2el_ms"))
    assert bare["completed"] == 3 and bare["mean_ttft_ms"] is not None


def test_rejected_requests_leave_vllms_input_tokens_to_the_completed_ones():
    row = decode_row(rejected=2)
    assert to_vllm(row)["total_input_tokens"] is None  # the row's count includes the rejected prompts
    with_table = to_vllm(row, requests_table(SEQS, "paged_torch", "r"))
    assert with_table["total_input_tokens"] == 16 and with_table["failed"] == 2 and with_table["num_prompts"] == 5


def test_parallel_samples_keep_the_summaries_but_not_vllms_one_output_per_prompt_lists():
    seqs = SEQS + [seq(0, 0.0, [0.06, 0.08, 0.11, 0.13], 5, sample=1)]
    result = to_vllm(decode_row(seqs), requests_table(seqs, "paged_torch", "r"))
    assert result["completed"] == 3 and result["ttfts"] is None and result["output_lens"] is None


@pytest.mark.parametrize("arrival, rate, shape", [
    (ArrivalConfig("burst"), "inf", None),
    (ArrivalConfig("gamma", rate=4.0, burstiness=0.5), 4.0, 0.5),
    (ArrivalConfig("constant", rate=3.0), 3.0, None),
])
def test_each_arrival_process_is_written_as_vllm_and_read_back_as_kvbench(arrival, rate, shape):
    row = decode_row(arrival=arrival)
    result = to_vllm(row, burstiness=arrival.burstiness)
    assert (result["request_rate"], result["burstiness"]) == (rate, shape)
    back = from_vllm(result)
    assert back["arrival"] == arrival.name and back["request_rate"] == row["request_rate"]


def test_only_decode_rows_that_measured_get_a_file_and_stale_ones_go(tmp_path):
    (tmp_path / "vllm-old.json").write_text("{}")
    rows = [decode_row(), {**decode_row(), "impl": "a/b c"}, {**decode_row(), "impl": "x", "status": "error"},
            {"scenario": "capacity", "status": "ok", "impl": "y"}]
    written = write_vllm_results(tmp_path, rows, None, None)
    assert sorted(p.name for p in written) == ["vllm-a_b_c.json", "vllm-paged_torch.json"] == \
        sorted(p.name for p in tmp_path.glob("vllm-*.json"))
    assert result_name("../x") == "vllm-.._x.json" and "/" not in result_name("a/b")


def test_a_real_vllm_file_reads_in_kvbench_units():
    """tests/helpers/vllm_bench_serve_result.json: a --save-result --save-detailed file, keys as vLLM writes them."""
    raw = json.loads(FIXTURE.read_text())
    row = from_vllm(raw)
    assert row["ttft_ms_mean"] == pytest.approx(48.175) and row["ttft_ms_p50"] == pytest.approx(46.15)
    assert row["tpot_ms_p99"] == pytest.approx(raw["p99_tpot_ms"]) and row["itl_ms_mean"] == pytest.approx(12.0544, rel=1e-4)
    assert row["duration_s"] == pytest.approx(2.5561) and row["wall_s"] == row["duration_s"]
    assert row["achieved_rps"] == pytest.approx(4 / 2.5561) and row["output_tokens_per_s"] == pytest.approx(416 / 2.5561)
    assert (row["prompt_tokens"], row["output_tokens"], row["num_requests"], row["rejected"]) == (1792, 416, 4, 0)
    # s per output token, from the per-request lists (latencies in s)
    assert row["normalized_latency_s"] == pytest.approx(np.mean(np.array(raw["latencies"]) / raw["output_lens"]))
    assert 0.01 < row["normalized_latency_s"] < 0.02
    assert (row["arrival"], row["request_rate"], row["model"]) == ("poisson", 2.0, "meta-llama/Llama-3.1-8B-Instruct")
    assert row["e2el_ms_mean"] is None and row["goodput_rps"] is None  # not in the file: not invented


@pytest.mark.parametrize("change, names", [
    ({"mean_ttft_ms": "12.5"}, "mean_ttft_ms"),
    ({"completed": 2.5}, "completed"),
    ({"total_output_tokens": 3.5}, "total_output_tokens"),
    ({"duration": True}, "duration"),
    ({"p99_itl_ms": 10**400}, "p99_itl_ms"),  # a JSON integer no float holds: float math would overflow
    ({"burstiness": -1.0}, "burstiness"),  # a setting, not a figure: no row column would hold it
    ({"burstiness": float("nan")}, "burstiness"),
    ({"request_rate": "fast"}, "request_rate"),
    ({"model_id": ["a"]}, "model_id"),
    ({"latencies": [0.1, "x"]}, "latencies[1]"),
    ({"latencies": [0.1]}, "latencies"),
])
def test_a_wrong_value_is_one_line_naming_its_key(change, names):
    with pytest.raises(VllmJsonError) as e:
        from_vllm({**json.loads(FIXTURE.read_text()), **change})
    assert str(e.value).startswith(names) and "\n" not in str(e.value)


def test_a_run_where_every_request_failed_is_an_error_row():
    row = from_vllm({"duration": 1.0, "completed": 0, "failed": 4, "request_rate": "inf"})
    assert row["status"] == "error" and row["arrival"] == "burst" and row["rejected"] == 4


def test_a_file_that_cannot_be_written_is_one_line_and_leaves_no_half_file(tmp_path, monkeypatch):
    from pathlib import Path

    from kvbench.harness.results import TableWriteError

    def full(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(TableWriteError) as e:
        write_vllm_results(tmp_path, [decode_row()], None, None)
    monkeypatch.undo()
    assert "No space left on device" in str(e.value) and "\n" not in str(e.value)
    assert list(tmp_path.iterdir()) == []


def _read(**change) -> dict:
    """The fixture file with ``change`` applied, read as a row."""
    return from_vllm({**json.loads(FIXTURE.read_text()), **change})


@pytest.mark.parametrize("change, clauses", [
    # the reproducer: each figure impossible, and the row said ok
    ({"duration": -2.5561, "request_throughput": -1.56, "mean_ttft_ms": -48.2},
     ["duration = -2.5561: a time, allowed >= 0", "request_throughput = -1.56: a rate, allowed >= 0",
      "mean_ttft_ms = -48.2: a time, allowed >= 0"]),
    ({"p90_e2el_ms": -1.0}, ["p90_e2el_ms = -1: a time, allowed >= 0"]),  # another family
    ({"total_output_tokens": -416}, ["total_output_tokens = -416: a count"]),
    ({"completed": -4}, ["completed = -4: a count"]),  # no row column holds it: checked all the same
    ({"completed": float("nan")}, ["completed = nan: allowed a finite number"]),
    ({"request_rate": -2.0}, ["request_rate = -2: a rate"]),  # the offered rate
    ({"latencies": [1.5407, -1.1884, 1.649, 0.781]}, ["latencies[1] = -1.1884: a time"]),  # the mean stays > 0
    ({"latencies": [-1.5407, -1.1884, -1.649, -0.781]},
     ["latencies[0] = -1.5407", "mean of latencies / output_lens = -"]),
    ({"output_lens": [128, 96, float("nan"), 64]}, ["output_lens[2] = nan: allowed a finite number"]),
    ({"p99_itl_ms": float("nan")}, ["p99_itl_ms = nan: allowed a finite number"]),
    ({"failed": float("inf"), "mean_tpot_ms": float("-inf")},
     ["failed = inf: allowed a finite", "mean_tpot_ms = -inf: allowed a finite"]),
])
def test_an_impossible_figure_makes_an_error_row_naming_its_key_and_value(change, clauses):
    row = _read(**change)
    assert row["status"] == "error" and "\n" not in row["error"]
    for clause in clauses:
        assert clause in row["error"], (clause, row["error"])
    for col, v in row.items():  # NaN would read as "not measured": the error keeps what the file said
        assert not (isinstance(v, float) and v != v) and v not in (float("inf"), float("-inf")), col


@pytest.mark.parametrize("change, clauses", [
    # the reproducers: goodput above the request throughput, a p99 below its median
    ({"request_goodput": 50.0}, ["request_goodput = 50 > request_throughput = 1.56488: goodput counts completed "
                                 "requests, allowed <= request_throughput"]),
    ({"p99_ttft_ms": 20.0},
     ["p99_ttft_ms = 20 < median_ttft_ms = 46.15: a higher percentile, allowed >= median_ttft_ms"]),
    ({"p90_tpot_ms": 13.0}, ["p99_tpot_ms = 12.488 < p90_tpot_ms = 13"]),  # p90 between them
    ({"p90_itl_ms": 11.0}, ["p90_itl_ms = 11 < median_itl_ms = 12.1"]),
    # throughputs are vLLM's counts over duration: a rate from another count, duration or unit
    ({"request_throughput": 15.648840029732798},
     ["request_throughput = 15.6488, but (completed) / duration = 1.56488: allowed within 0.1% of it"]),
    ({"output_throughput": 0.1627479363092211}, ["output_throughput = 0.162748, but (total_output_tokens) / duration"]),
    ({"total_token_throughput": 900.0},
     ["total_token_throughput = 900, but (total_input_tokens + total_output_tokens)"]),
    ({"completed": 40}, ["request_throughput = 1.56488, but (completed) / duration = 15.6488"]),
])
def test_figures_that_contradict_each_other_make_an_error_row_naming_both_keys(change, clauses):
    row = _read(**change)
    assert row["status"] == "error" and "\n" not in row["error"]
    for clause in clauses:
        assert clause in row["error"], (clause, row["error"])


def test_goodput_above_throughput_in_a_file_of_bare_summaries():
    """The issue's file: nothing else wrong, so the goodput clause is the whole error."""
    row = from_vllm({"duration": 10.0, "completed": 3, "request_throughput": 0.3, "request_goodput": 50.0})
    assert row["status"] == "error"
    assert row["error"] == ("request_goodput = 50 > request_throughput = 0.3: goodput counts completed requests, "
                            "allowed <= request_throughput")


def test_figures_true_to_the_last_digit_or_rounded_as_printed_stay_ok():
    # every request met the SLO: goodput is the throughput, one float step apart along other arithmetic
    same = _read(request_goodput=np.nextafter(1.5648840029732798, 2.0), p90_ttft_ms=46.15, p99_ttft_ms=46.15)
    assert same["status"] == "ok" and same.get("error") is None
    # vLLM's console figures, two decimals each (150.87 s, 0.21 req/s for 32 / 150.87 = 0.2121)
    printed = from_vllm({"duration": 150.87, "completed": 32, "total_input_tokens": 65536, "total_output_tokens": 65536,
                         "request_throughput": 0.21, "output_throughput": 434.40, "total_token_throughput": 868.80,
                         "median_ttft_ms": 7099.88, "p99_ttft_ms": 10999.46, "mean_ttft_ms": 7279.56})
    assert printed["status"] == "ok", printed.get("error")
    # the same file with a throughput a tenth of its counts over duration is not rounding
    assert from_vllm({"duration": 150.87, "completed": 32, "request_throughput": 0.021})["status"] == "error"


def test_an_error_row_keeps_its_own_reason_first():
    row = from_vllm({"duration": -1.0, "completed": 0, "failed": 4})
    assert row["error"].startswith("no request completed; duration = -1: a time, allowed >= 0")
