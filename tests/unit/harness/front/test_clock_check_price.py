"""Pricing a published point: its command line, and its figure read from a run's requests, worked by hand."""

import dataclasses

import pytest

from kvbench.harness.front.clock_check_points import load_points
from kvbench.harness.front.clock_check_price import RequestTimes, metric_value, overrides, price, unpriceable


def _point(pid):
    return {p.id: p for p in load_points()}[pid]


def test_a_closed_loop_row_becomes_burst_arrivals_sent_by_a_client_with_its_cap(tmp_path):
    # ai.wmx.dev's L4 row: vLLM, Qwen2.5-0.5B, 256 in / 128 out, --max-concurrency 8, 1000 prompts. A client sends
    # them through the server: not offline, though every request is there at t=0 (the front-end cost applies)
    args = overrides(_point("l4-c8-e2el"), cap=300, repo=tmp_path)
    assert args == ["scenario=capacity", "model=qwen2.5-0.5b", "dtype=bfloat16", "gpu=l4", "gpu.count=1",
                    "workload=fixed", "workload.prompt_len=256", "workload.output_len=128",
                    "workload.num_requests=300", "max_seq_len=384", "batch=256", "+impl=paged", "seed=0",
                    "arrival=burst", "arrival.max_concurrency=8", "engine.offline=false"]


def test_an_offline_tp2_fp8_row_runs_what_fits_whole_for_six_waves(tmp_path):
    # TensorRT-LLM's Llama-3.3-70B FP8 on 2 x H100, 2048/2048, 1500 requests; 59 sequences fit whole
    point = _point("trt70b-h100tp2-2048-2048")
    args = overrides(point, cap=300, repo=tmp_path, fits=59)
    assert "batch=59" in args and "workload.num_requests=354" in args  # max(300, 6 x 59), under 1500
    assert {"gpu=h100-sxm", "gpu.count=2", "model=llama-3.1-70b", "weight_dtype=fp8", "kv_dtype=fp8_e4m3",
            "max_seq_len=4096", "arrival=burst"} <= set(args)
    assert "engine.offline=false" not in args  # offline: no server, no front-end cost
    assert not any(a.startswith("engine=") for a in args)  # no conf/engine/trtllm.yaml under tmp_path
    (tmp_path / "conf" / "engine").mkdir(parents=True)
    (tmp_path / "conf" / "engine" / "trtllm.yaml").write_text("name: trtllm\n")
    assert "engine=trtllm" in overrides(point, cap=300, repo=tmp_path, fits=59)
    assert "batch=512" in overrides(point, cap=300, repo=tmp_path, fits=900)  # at most OFFLINE_BATCH
    rated = dataclasses.replace(point, request_rate=2.5)
    assert {"arrival=poisson", "arrival.rate=2.5", "batch=256", "workload.num_requests=300"} <= set(
        overrides(rated, cap=300, repo=tmp_path))


# Three requests of 5 output tokens, all made at t=0 and served one at a time: an open burst (every arrival at 0, the
# queue counts) and a closed loop at concurrency 1 (each sent when the one before came back: its arrival).
BURST = [RequestTimes(16, 5, 0.0, 0.000, 0.010, 0.050),
         RequestTimes(16, 5, 0.0, 0.050, 0.062, 0.102),
         RequestTimes(16, 5, 0.0, 0.102, 0.110, 0.150)]
CLOSED = [RequestTimes(16, 5, r.admitted_s, r.admitted_s, r.first_token_s, r.finish_s) for r in BURST]


@pytest.mark.parametrize("metric,closed,want", [
    ("ttft_ms_mean", True, 10.0),  # 10, 12, 8 ms from sending
    ("ttft_ms_p50", True, 10.0),
    ("ttft_ms_mean", False, (10 + 62 + 110) / 3),  # from arrival: the queue counts
    ("ttft_ms_p50", False, 62.0),
    ("e2el_ms_p50", True, 50.0),  # 50, 52, 48
    ("tpot_ms_mean", True, 10.0),  # 40 ms over 4 gaps each
    ("itl_ms_mean", True, 10.0),
    ("output_tok_s", True, 100.0),  # 15 tokens over 0.150 s
    ("req_s", False, 20.0),
])
def test_metrics_from_a_requests_table_worked_by_hand(metric, closed, want):
    assert metric_value(metric, CLOSED if closed else BURST) == pytest.approx(want)


def test_no_requests_or_an_unknown_metric_is_an_error():
    with pytest.raises(ValueError, match="no finished"):
        metric_value("ttft_ms_mean", [])
    with pytest.raises(ValueError, match="metric='goodput'"):
        metric_value("goodput", BURST)


def test_a_priced_closed_loop_at_concurrency_one_is_back_to_back():
    """Priced by the command line: at concurrency 1 the client sends a request when the one before is back (its
    front-end cost paid), so the run's span is the sum of its requests' E2EL and output tok/s x mean E2EL = the
    output length (128) exactly."""
    point = _point("l4-c1-tput")
    tput = price(point, cap=12)
    e2el = price(dataclasses.replace(point, metric="e2el_ms_mean"), cap=12)
    assert tput.reason == "" and tput.requests == 12
    assert tput.simulated * e2el.simulated / 1e3 == pytest.approx(128, rel=1e-6)
    assert "arrival.max_concurrency=1" in tput.command and "gpu=l4" in tput.command


def test_a_point_without_a_model_conf_is_not_priced_and_says_why():
    from dataclasses import replace

    got = price(replace(_point("q72-h100tp2-128-ttft"), model="qwen9-999b"))  # a model kvbench has no conf for
    assert got.simulated is None and "conf/model/qwen9-999b.yaml" in got.reason
    assert "model=qwen9-999b" in got.command and "gpu.count=2" in got.command


def test_a_row_whose_outputs_stop_at_eos_prices_fixed_prompts_and_uniform_outputs_up_to_max_tokens(tmp_path):
    args = overrides(_point("r4090-c16-ttft"), cap=300, repo=tmp_path)
    assert args[5:10] == ["workload=uniform", "workload.spread=0", "workload.prompt_len=256",
                          "workload.output_len=100", "workload.output_spread=0.28"]  # outputs in [72, 128]
    assert "max_seq_len=384" in args and not any(a.startswith("workload=fixed") for a in args)



def test_a_rows_engine_overrides_follow_its_engine_profile_on_the_command_line(tmp_path):
    # A row whose source ran other kernels than the profile's defaults (an older release's) says so, and its run
    # gets them after engine=, where Hydra applies them over the profile; without a profile there is nothing to
    # override, so none is passed, and the point is not priced: it would read as priced with them
    point = dataclasses.replace(_point("l4-c8-e2el"), engine_overrides=("engine.moe_gemm_half_n=1400",))
    assert overrides(point, cap=300, repo=tmp_path)[-1] == "engine.offline=false"
    (tmp_path / "conf" / "model").mkdir(parents=True)
    (tmp_path / "conf" / "gpu").mkdir(parents=True)
    (tmp_path / "conf" / "model" / f"{point.model}.yaml").write_text("")
    (tmp_path / "conf" / "gpu" / f"{point.gpu}.yaml").write_text("")
    assert unpriceable(point, tmp_path) == ("engine_overrides (engine.moe_gemm_half_n=1400) override an engine "
                                            "profile, and engine=vllm_v1 has none in conf/engine/")
    (tmp_path / "conf" / "engine").mkdir(parents=True)
    (tmp_path / "conf" / "engine" / "vllm_v1.yaml").write_text("name: vllm_v1\n")
    assert overrides(point, cap=300, repo=tmp_path)[-2:] == ["engine=vllm_v1", "engine.moe_gemm_half_n=1400"]
    assert unpriceable(point, tmp_path) == ""
