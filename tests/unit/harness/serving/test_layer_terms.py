"""Sliding windows and mixtures of experts in the simulated clock (harness/serving/layer_terms.py, roofline v4):
the closed forms against brute force, the expected experts against sampled routing, and a step of the real-size
configs priced by hand."""

from __future__ import annotations

import random

import pytest

from kvbench.harness.model.hf_config import resolve_model_config
from kvbench.harness.serving.cost_model import CostModel, GpuSpec, ModelCost, model_cost
from kvbench.harness.serving.layer_terms import (
    Experts, WindowShare, prefill_pairs, window_shares, windowed_read, windowed_read_over_steps,
)
from tests.helpers.models import load_named

GEMMA = (WindowShare(1024, 5 / 6),)


def test_window_shares_follow_the_layer_types():
    assert window_shares(None, 4096) == () and window_shares(["full_attention"] * 4, None) == ()
    assert window_shares(["sliding_attention"] * 5 + ["full_attention"], 1024) == GEMMA
    gemma = resolve_model_config(load_named("gemma-3-27b"))
    (share,) = window_shares(gemma.layer_types, gemma.sliding_window)
    assert share.window == gemma.sliding_window and share.fraction == pytest.approx(52 / 62)


def test_an_equal_context_batch_reads_each_sliding_layer_up_to_its_window():
    # 4 sequences of 4096 tokens: full layers (1/6) read 4096, sliding ones (5/6) 1024, per sequence.
    assert windowed_read(GEMMA, 4, 4 * 4096) == pytest.approx(4 * (4096 / 6 + 5 / 6 * 1024))
    assert windowed_read(GEMMA, 4, 4 * 500) == 4 * 500  # inside the window: everything is read
    assert windowed_read((), 4, 12345) == 12345 and windowed_read(GEMMA, 0, 0) == 0


@pytest.mark.parametrize("seed", range(6))
def test_the_jump_closed_form_is_the_sum_of_its_steps(seed):
    rng = random.Random(seed)
    shares = tuple(WindowShare(rng.randint(1, 300), rng.random() / 2) for _ in range(rng.randint(1, 2)))
    batch, steps = rng.randint(1, 9), rng.randint(1, 400)
    tokens = rng.randint(0, 600 * batch)  # means below, across and past the windows, fractional ones too
    brute = sum(windowed_read(shares, batch, tokens + j * batch) for j in range(steps))
    assert windowed_read_over_steps(shares, batch, tokens, steps) == pytest.approx(brute, rel=1e-9, abs=1e-6)


def test_expected_distinct_experts_match_sampled_routing():
    experts = Experts(layers=1, count=128, per_token=4, expert_bytes=1, expert_params=1)
    assert experts.distinct(1) == pytest.approx(4) and experts.distinct(0) == 0
    assert experts.distinct(4096) == pytest.approx(128, rel=1e-6)
    rng = random.Random(0)
    for tokens in (2, 8, 32, 100):
        sampled = sum(len({e for _ in range(tokens) for e in rng.sample(range(128), 4)}) for _ in range(400)) / 400
        assert experts.distinct(tokens) == pytest.approx(sampled, rel=0.03)
    assert Experts().distinct(10) == 0 and Experts().inactive_params == 0


H100 = GpuSpec("h", memory_mib=81559, bandwidth_gbps=3350, tflops=989, bw_efficiency=0.8, flops_efficiency=0.6,
               interconnect_gbps=450, interconnect_latency_us=10)


def test_a_mixture_reads_the_experts_its_batch_routes_to():
    cfg = resolve_model_config(load_named("gpt-oss-120b"))
    cost = model_cost(cfg, "bfloat16")
    e = cost.experts
    assert (e.count, e.per_token, e.layers) == (cfg.num_experts, cfg.num_experts_per_tok, cfg.num_layers)
    # MXFP4: 4.25 bits a value, so one expert's three matrices take 3*H*I*17/32 bytes.
    assert e.expert_bytes == pytest.approx(3 * cfg.hidden_size * cfg.moe_intermediate_size * 17 / 32, rel=1e-6)
    clock = CostModel(H100, cost)
    dense_part = cost.weight_bytes - e.layers * e.count * e.expert_bytes
    one = dense_part + e.layers * e.per_token * e.expert_bytes  # one token reads k experts a layer
    assert clock.weights_s(1) == pytest.approx(one / clock.bytes_per_s, rel=1e-6)
    assert clock.weights_s(1) < clock.weights_s(16) < clock.weights_s(4096) <= clock.weights_s()
    assert clock.decode_s(1, 0) == pytest.approx(clock.weights_s(1), rel=1e-9)  # batch 1 streams the weights
    # Compute counts the active parameters: k experts a token, less the embedding table and the LM head (version 5).
    tables = (1 if cost.tied_head else 2) * cost.head_params
    assert cost.active_params == cost.params - e.layers * (e.count - e.per_token) * e.expert_params - tables


def test_a_dense_full_attention_model_is_priced_as_before():
    cost = model_cost(resolve_model_config(load_named("llama-3.1-8b")), "bfloat16")
    assert cost.windows == () and cost.experts == Experts() and cost.active_params == cost.params - 2 * cost.head_params
    plain = ModelCost(cost.params, cost.weight_bytes, cost.kv_bytes_per_token, cost.num_layers, cost.hidden_size, 2,
                      head_params=cost.head_params)
    a, b = CostModel(H100, cost), CostModel(H100, plain)
    for batch, read, steps in ((1, 100, 1), (64, 64 * 3000, 7), (256, 10**6, 300)):
        assert a.decode_s(batch, read, steps) == b.decode_s(batch, read, steps)
        assert a.prefill_s(batch * 16) == b.prefill_s(batch * 16)


def test_a_sliding_model_steps_stop_growing_at_the_window():
    cost = model_cost(resolve_model_config(load_named("gemma-3-27b")), "bfloat16")
    clock = CostModel(H100, cost)
    (share,) = cost.windows
    w = share.window
    # Past the window, each step reads only the full layers' new tokens: the growth is (1 - fraction) of a token.
    grow = clock.decode_s(8, 8 * (4 * w + 1)) - clock.decode_s(8, 8 * 4 * w)
    assert grow == pytest.approx(8 * (1 - share.fraction) * clock.attention_s(1), rel=1e-6)
    steps = clock.decode_steps_s(8, 8 * (w - 50), 200)
    assert sum(steps) == pytest.approx(clock.decode_s(8, 8 * (w - 50), 200), rel=1e-9)


def test_a_grouped_pool_and_a_uniform_one_price_the_same_steps(compose, tmp_path):
    """kv_manager=hybrid counts its memory in layer slots; the clock still prices what attention reads (each
    sequence's context, a sliding layer's window at most), so with room for everything both managers run the same
    schedule at the same simulated times."""
    from kvbench.harness.front.job import run_job

    common = ["+impl=paged", "impl.prefix_caching=false", "scenario=capacity", "model=gemma-3-27b", "gpu=h100-sxm",
              "dtype=bfloat16", "batch=4", "max_seq_len=4096", "workload=fixed", "workload.prompt_len=2000",
              "workload.output_len=300", "workload.num_requests=4"]
    rows = {}
    for manager in ("uniform", "hybrid"):
        (row,), code = run_job(compose([*common, f"kv_manager={manager}"]), tmp_path / manager)
        assert code == 0, row.get("error")
        rows[manager] = row
    assert rows["hybrid"]["kv_manager"] == "hybrid" and rows["hybrid"]["preemptions"] == 0
    for column in ("ttft_ms_p50", "tpot_ms_p50", "duration_s"):
        assert rows["hybrid"][column] == pytest.approx(rows["uniform"][column], rel=1e-9), column


@pytest.mark.parametrize("seed", range(8))
def test_prompt_pairs_are_the_causal_pairs_each_layer_attends_to(seed):
    """prefill_pairs against counting: position p attends to p + 1 keys, at most a sliding layer's window."""
    rng = random.Random(seed)
    shares = tuple(WindowShare(rng.randint(1, 200), rng.random() / 2) for _ in range(rng.randint(0, 2)))
    spans = []
    for _ in range(rng.randint(1, 4)):
        start = rng.randint(0, 300)
        spans.append((start, start + rng.randint(0, 300)))
    full = sum(p + 1 for a, b in spans for p in range(a, b))
    expected = full * (1 - sum(s.fraction for s in shares))
    for s in shares:
        expected += s.fraction * sum(min(p + 1, s.window) for a, b in spans for p in range(a, b))
    assert prefill_pairs(shares, tuple(spans)) == pytest.approx(expected)
    assert prefill_pairs(shares, ()) == 0


def test_a_chunked_prompt_attends_to_the_pairs_of_the_whole_prompt():
    """Chunks of one prompt, each attending to the chunks before it: their pairs sum to the whole prompt's."""
    whole = prefill_pairs(GEMMA, ((0, 5000),))
    assert sum(prefill_pairs(GEMMA, ((a, min(a + 2048, 5000)),)) for a in range(0, 5000, 2048)) == \
        pytest.approx(whole)
    assert prefill_pairs((), ((0, 2048),)) == 2048 * 2049 / 2


def test_a_sliding_share_is_of_the_caching_layers():
    """A linear-attention layer caches no token: a model of 2 sliding, 2 full and 4 linear layers slides half its
    KV (and half its prompts' attention pairs), not a quarter."""
    kinds = ["sliding_attention", "full_attention", "linear_attention", "linear_attention"] * 2
    (share,) = window_shares(kinds, 64)
    assert share == WindowShare(64, 0.5)
