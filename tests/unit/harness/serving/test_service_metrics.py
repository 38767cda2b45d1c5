"""Service metrics on hand-built timelines (exact), the max-rate search against brute force,
and the engine serving requests as they arrive."""

from __future__ import annotations

import dataclasses
import random

import pytest

from kvbench.harness.config import ArrivalConfig, SloConfig
from kvbench.harness.scenarios.max_rate import search_rate
from kvbench.harness.serving.sequence import Sequence
from kvbench.harness.serving.service_metrics import offered_rate, request_timings, slo_label, summarize
from kvbench.harness.serving.workload import Request


def seq(request_id, sample, arrival, admitted, token_s, prompt_len=4, preempted=0):
    s = Sequence(0, request_id, sample, list(range(prompt_len)), len(token_s), arrival_s=arrival,
                 admitted_s=admitted, token_s=list(token_s), preempted=preempted,
                 first_token_s=token_s[0], finish_s=token_s[-1])
    s.output_ids = [1] * len(token_s)
    return s


def test_each_metric_on_a_hand_built_timeline():
    # request 0: arrives 0.0, admitted 0.5, tokens at 1.0, 1.5, 2.5 (3 tokens)
    # request 1: arrives 1.0, admitted 1.0, tokens at 1.2, 1.4 (2 tokens), preempted once
    seqs = [seq(0, 0, 0.0, 0.5, [1.0, 1.5, 2.5]), seq(1, 0, 1.0, 1.0, [1.2, 1.4], preempted=1)]
    timings = request_timings(seqs)
    assert [t.ttft_s for t in timings] == pytest.approx([1.0, 0.2])
    assert [t.e2el_s for t in timings] == pytest.approx([2.5, 0.4])
    assert [t.queue_s for t in timings] == pytest.approx([0.5, 0.0])
    assert [t.tpot_s for t in timings] == pytest.approx([0.75, 0.2])  # (2.5-1)/2, (0.4-0.2)/1
    assert [t.normalized_latency_s for t in timings] == pytest.approx([2.5 / 3, 0.4 / 2])
    row = summarize(timings, offered=2, duration_s=2.5, slo=SloConfig())
    assert row["ttft_ms_mean"] == pytest.approx(600.0)
    assert row["ttft_ms_p50"] == pytest.approx(600.0)  # linear interpolation between 200 and 1000
    assert row["ttft_ms_p90"] == pytest.approx(920.0)
    assert row["e2el_ms_p99"] == pytest.approx(400 + 0.99 * 2100)
    assert row["itl_ms_mean"] == pytest.approx((500 + 1000 + 200) / 3)  # every gap, every sequence
    assert row["itl_ms_p50"] == pytest.approx(500.0)
    assert row["queue_ms_mean"] == pytest.approx(250.0)
    assert row["normalized_latency_s"] == pytest.approx((2.5 / 3 + 0.2) / 2)
    assert row["achieved_rps"] == pytest.approx(2 / 2.5) and row["duration_s"] == 2.5
    assert "goodput_rps" not in row and "slo_pass" not in row  # no SLO set: no verdict invented


def test_parallel_samples_are_one_request():
    # TTFT is the earliest sample's first token, E2EL the latest sample's finish.
    seqs = [seq(7, 0, 0.0, 0.1, [0.3, 0.9]), seq(7, 1, 0.0, 0.1, [0.2, 1.1])]
    (t,) = request_timings(seqs)
    assert t.samples == 2 and t.ttft_s == pytest.approx(0.2) and t.e2el_s == pytest.approx(1.1)
    assert sorted(t.itl_s) == pytest.approx([0.6, 0.9])


def test_one_output_token_has_no_tpot():
    (t,) = request_timings([seq(0, 0, 0.0, 0.0, [0.4])])
    assert t.tpot_s is None
    row = summarize([t], 1, 0.4, SloConfig(tpot_ms=1.0))
    assert row["tpot_ms_p50"] is None and row["slo_pass"]  # TPOT undefined: not held against it


def test_slo_goodput_attainment_and_pass():
    seqs = [seq(i, 0, 0.1 * i, 0.1 * i, [0.1 * i + ttft, 0.1 * i + ttft + 0.05]) for i, ttft in
            enumerate([0.1, 0.2, 0.3, 0.9])]
    timings = request_timings(seqs)
    slo = SloConfig(name="t", ttft_ms=250, percentile=50)
    row = summarize(timings, offered=4, duration_s=2.0, slo=slo)
    assert row["slo_attainment"] == 0.5 and row["goodput_rps"] == pytest.approx(1.0)
    assert row["slo_pass"]  # the median TTFT (250 ms) is within 250 ms
    assert not summarize(timings, 4, 2.0, dataclasses.replace(slo, percentile=90))["slo_pass"]
    # a request that never finished misses the SLO and fails the run
    short = summarize(timings[:2], offered=3, duration_s=2.0, slo=slo)
    assert short["slo_attainment"] == pytest.approx(2 / 3) and not short["slo_pass"]
    # the paper's criterion: the mean normalized latency
    paper = SloConfig(normalized_latency_s=0.3)
    mean_norm = summarize(timings, 4, 2.0, paper)["normalized_latency_s"]
    assert summarize(timings, 4, 2.0, paper)["slo_pass"] == (mean_norm <= 0.3)


@pytest.mark.parametrize("slo, label", [
    (SloConfig(), None),  # slo=none: nothing checked
    (SloConfig(name="none", percentile=50), None),
    (SloConfig(name="interactive", ttft_ms=450, tpot_ms=40), "interactive"),
    (SloConfig(name="none", ttft_ms=450.0, tpot_ms=40.0), "interactive"),  # the preset's limits, however set
    (SloConfig(name="none", ttft_ms=100), "ttft_ms<=100@p99"),
    (SloConfig(name="none", tpot_ms=10, percentile=50), "tpot_ms<=10@p50"),
    (SloConfig(name="interactive", ttft_ms=450, tpot_ms=50), "ttft_ms<=450,tpot_ms<=50@p99"),  # one limit changed
    (SloConfig(name="interactive", ttft_ms=450, tpot_ms=40, percentile=90), "ttft_ms<=450,tpot_ms<=40@p90"),
    (SloConfig(name="my-slo", normalized_latency_s=0.01), "normalized_latency_s<=0.01"),  # a mean: no percentile
    (SloConfig(e2el_ms=2000, normalized_latency_s=0.1, percentile=99.9), "e2el_ms<=2000@p99.9,normalized_latency_s<=0.1"),
])
def test_slo_label_names_a_preset_only_when_its_limits_are_the_presets(slo, label):
    assert slo_label(slo) == label


def test_offered_rate():
    reqs = [Request(i, (1,), 1, arrival_s=t) for i, t in enumerate([0.0, 1.0, 4.0])]
    assert offered_rate(ArrivalConfig(), reqs) is None  # burst: no rate
    assert offered_rate(ArrivalConfig(name="poisson", rate=3.0), reqs) == 3.0
    assert offered_rate(ArrivalConfig(name="trace"), reqs) == pytest.approx(2 / 4.0)


@pytest.mark.parametrize("seed", range(20))
def test_max_rate_search_matches_brute_force(seed):
    rng = random.Random(seed)
    threshold = rng.uniform(0.05, 40) if seed else 0.1  # seed 0: nothing from the start rate passes
    start, limit, tol = rng.choice([0.5, 1.0, 3.0]), 32.0, 0.25
    calls = []

    def passes(rate):
        calls.append(rate)
        return rate <= threshold

    found, probes = search_rate(passes, start, limit, tol)
    assert probes == len(calls)
    grid = [k * tol / 8 for k in range(1, int(limit / tol * 8) + 1)]
    brute = max((r for r in grid if passes(r)), default=0.0)
    if threshold >= limit:
        assert found == limit
    else:
        assert found <= threshold and brute - found <= tol  # within the tolerance of the best on a fine grid


def test_engine_serves_requests_as_they_arrive(compose, tmp_path):
    """Arrivals spread over time: every request once, sane timelines, and the same tokens as a burst."""
    from kvbench.harness.scenarios.context import JobContext
    from kvbench.harness.kv.factory import build_cache
    from kvbench.harness.serving.engine import Engine
    from kvbench.harness.measure.fingerprint import collect
    from kvbench.harness.front.resolve import resolve

    cfg = resolve(compose(["+impl=paged_torch", "model=tiny-llama", "device=cpu", "batch=4", "max_seq_len=64",
                           "workload=uniform", "workload.num_requests=6", "workload.prompt_len=10",
                           "workload.output_len=6"]))
    ctx = JobContext(cfg, tmp_path, collect("cpu"))
    outputs = {}
    for gap in (0.0, 0.05):
        reqs = [dataclasses.replace(r, arrival_s=gap * (i + 1)) for i, r in enumerate(ctx.workload.requests)]
        cache = build_cache(cfg.impl, cfg, 2_000_000, ctx.job.device)
        res = Engine(ctx.compute.model, cache, cfg.batch, cfg.max_num_batched_tokens).run(reqs)
        assert sorted(s.request_id for s in res.sequences) == list(range(6))
        for s in res.sequences:
            assert s.arrival_s <= s.admitted_s <= s.first_token_s <= s.finish_s
            assert len(s.token_s) == len(s.output_ids) and s.token_s == sorted(s.token_s)
        if gap:
            assert res.idle_s > 0.0 and res.elapsed_s >= 6 * gap  # waited for the first arrival at least
            assert all(st.t_s >= 0.05 for st in res.records) and {st.kind for st in res.records} == {"prefill", "decode"}
        outputs[gap] = [s.output_ids for s in res.sequences]
    assert outputs[0.0] == outputs[0.05]
