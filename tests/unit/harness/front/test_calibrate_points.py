"""A user's ``vllm bench serve`` result files as calibration points: the sample file, a closed loop, bad files and the
split."""

from __future__ import annotations

import json
import math

import pytest

from kvbench.harness.errors import ConfigError
from kvbench.harness.front.calibrate_points import Setup, all_points, read_result, split_points
from tests.conftest import REPO_ROOT

SAMPLE = REPO_ROOT / "tests" / "helpers" / "vllm_bench_serve_result.json"
SETUP = Setup(gpu="h100-sxm", model="llama-3.1-8b")


def closed_loop(**changes) -> dict:
    """A ``vllm bench serve --max-concurrency 8 --request-rate inf`` result without per-request lists."""
    result = {"date": "20260101-000000", "model_id": "Qwen/Qwen2.5-0.5B-Instruct", "num_prompts": 200,
              "request_rate": "inf", "burstiness": 1.0, "max_concurrency": 8, "duration": 20.0, "completed": 200,
              "failed": 0, "total_input_tokens": 51200, "total_output_tokens": 25600, "mean_ttft_ms": 27.0,
              "median_ttft_ms": 26.0, "mean_tpot_ms": 5.1, "median_tpot_ms": 5.0, "mean_e2el_ms": 675.0,
              "output_throughput": 1280.0, "request_throughput": 10.0}
    result.update(changes)
    return result


def write(tmp_path, result: dict, name: str = "run.json"):
    path = tmp_path / name
    path.write_text(json.dumps(result))
    return path


def test_the_sample_file_is_one_configuration_at_its_mean_lengths_with_one_point_per_figure():
    run = read_result(SAMPLE, SETUP)
    p = run.point
    # input_lens 512, 384, 640, 256 and output_lens 128, 96, 128, 64: means 448 and 104
    assert (p.prompt_len, p.output_len, p.num_requests, p.request_rate, p.max_concurrency) == (448, 104, 4, 2.0, None)
    assert (p.gpu, p.model, p.workload, p.published_model) == ("h100-sxm", "llama-3.1-8b", "fixed",
                                                               "meta-llama/Llama-3.1-8B-Instruct")
    figures = {q.metric: q.value for q in run.points}
    assert figures == {"ttft_ms_mean": 48.175, "ttft_ms_p50": 46.15, "tpot_ms_mean": 12.0,
                       "tpot_ms_p50": pytest.approx(11.95), "itl_ms_mean": pytest.approx(12.0544, rel=1e-4),
                       "itl_ms_p50": 12.1, "output_tok_s": pytest.approx(162.748, rel=1e-5)}
    assert run.points[0].id == "vllm_bench_serve_result.json:ttft_ms_mean"
    assert run.arrival == ()  # burstiness 1: Poisson, the clock check's own arrivals


def test_a_closed_loop_file_without_lists_takes_its_lengths_from_the_totals(tmp_path):
    run = read_result(write(tmp_path, closed_loop()), SETUP)
    p = run.point
    assert (p.prompt_len, p.output_len, p.max_concurrency, p.num_requests) == (256, 128, 8, 200)
    assert math.isinf(p.request_rate)
    assert [q.metric for q in run.points] == ["ttft_ms_mean", "ttft_ms_p50", "tpot_ms_mean", "tpot_ms_p50",
                                              "e2el_ms_mean", "output_tok_s"]  # request_throughput: not taken


def test_vllms_arrivals_other_than_poisson_become_kvbench_s_own(tmp_path):
    gamma = read_result(write(tmp_path, closed_loop(request_rate=4.0, burstiness=0.5)), SETUP)
    assert gamma.point.request_rate == 4.0 and gamma.arrival == ("arrival=gamma", "arrival.burstiness=0.5")
    assert read_result(write(tmp_path, closed_loop(request_rate=4.0, burstiness=math.inf)), SETUP).arrival == (
        "arrival=constant",)


@pytest.mark.parametrize("change,match", [
    ({"request_rate": None}, r"run\.json: request_rate: missing; kvbench needs it for the arrivals"),
    ({"total_input_tokens": None}, r"total_input_tokens: missing; .*mean input length \(or input_lens\)"),
    ({"max_concurrency": "eight"}, r"max_concurrency: 'eight' must be a whole number > 0"),
    ({"mean_ttft_ms": -3.0}, r"mean_ttft_ms: -3\.0 must be a number > 0"),
    ({"ramp_up_strategy": "linear"}, r"ramp_up_strategy: 'linear': a rate that changes .* allowed: null"),
    ({"input_lens": [256, "x"]}, r"input_lens\[1\]: 'x' must be a whole number >= 0"),
])
def test_a_bad_file_is_one_error_naming_the_file_and_the_key(tmp_path, change, match):
    with pytest.raises(ConfigError, match=match):
        read_result(write(tmp_path, closed_loop(**change)), SETUP)


def test_a_file_that_is_not_a_vllm_result_or_has_no_figure_says_so(tmp_path):
    with pytest.raises(ConfigError, match=r"not a vllm bench serve result: it has no 'duration' and 'completed'"):
        read_result(write(tmp_path, {"rows": []}), SETUP)
    with pytest.raises(ConfigError, match=r"not a readable JSON file"):
        read_result(tmp_path / "absent.json", SETUP)
    bare = {k: v for k, v in closed_loop().items() if not k.endswith("_ms") and k != "output_throughput"}
    with pytest.raises(ConfigError, match=r"no figure to calibrate on; expected at least one of mean_ttft_ms"):
        read_result(write(tmp_path, bare), SETUP)


def test_every_kth_point_over_all_files_is_held_out(tmp_path):
    runs = [read_result(write(tmp_path, closed_loop(), "a.json"), SETUP), read_result(SAMPLE, SETUP)]  # 6 + 7
    split = split_points(runs, 3)
    held = [n for n, (_, p) in enumerate(all_points(split)) if p.split == "holdout"]
    assert held == [2, 5, 8, 11]  # numbered across the files, in the order they were named
    assert [i for i, _ in all_points(split)] == [0] * 6 + [1] * 7
    assert all(p.split == "fit" for _, p in all_points(split_points(runs, 0)))
    assert split_points(runs, 3) == split  # deterministic
    with pytest.raises(ConfigError, match=r"--holdout-every=1: allowed: 0 \(no holdout\) or an integer >= 2"):
        split_points(runs, 1)
