"""The achieved reuse: first-admission prompt hits, recomputed tokens, evictions, per step and per run."""

from __future__ import annotations

import random

import pandas as pd
import pytest

from kvbench.harness.config import WorkloadConfig
from kvbench.harness.serving.prefix_reuse import ideal_prefix_reuse
from kvbench.harness.serving.reuse_meter import STEP_COLUMNS, ReuseMeter
from kvbench.harness.serving.simulator import simulate
from kvbench.harness.serving.timeline import steps_table
from kvbench.harness.serving.workload import Request, draw_workload
from kvbench.impls.block_manager import BlockManager
from kvbench.impls.lane_allocator import LaneAllocator


def run(alloc, requests, batch=6):
    meter = ReuseMeter(alloc)
    sim = simulate(alloc, requests, batch, 256, 32000, 1, observer=meter)
    return sim, meter


@pytest.mark.parametrize("kind", ["system_prompt", "plain"])
@pytest.mark.parametrize("blocks", [30, 80, 2000])
def test_achieved_never_beats_ideal_and_an_unbounded_cache_reaches_it(kind, blocks):
    w = WorkloadConfig(kind=kind, distribution="uniform", prompt_len=24, output_len=10, system_prompts=4,
                       system_prompt_len=40, shared_prefix_len=0 if kind == "system_prompt" else 20)
    requests = draw_workload(w, 40, 32000, 256, seed=blocks).requests
    alloc = BlockManager(blocks, 8)
    sim, meter = run(alloc, requests)
    ideal = ideal_prefix_reuse([r.prompt_ids for r in requests], 8)
    assert meter.prompt_tokens == ideal.prompt_tokens == sum(len(r.prompt_ids) for r in requests)
    assert 0 <= meter.hit_rate <= ideal.hit_rate
    if blocks == 2000:  # nothing is ever evicted: every reachable hit is found
        assert meter.evicted_blocks == 0 and meter.hit_tokens == ideal.hit_tokens
    else:
        assert meter.evicted_blocks > 0
    assert meter.hit_tokens + meter.recomputed_tokens <= alloc.cache_hit_tokens + meter.recomputed_tokens
    cols = meter.columns(ideal.hit_rate, ideal.prompt_tokens)
    assert cols["prefix_hit_rate"] == meter.hit_rate and cols["prefix_hit_rate_ideal"] == ideal.hit_rate
    # a request that never ran hits nothing: the row's rate is over every prompt token of the workload
    assert meter.columns(None, 2 * ideal.prompt_tokens)["prefix_hit_rate"] == pytest.approx(meter.hit_rate / 2)


def test_preemption_counts_recomputed_tokens_not_prompt_hits():
    """Two long requests in a pool that holds one and a half: the second is preempted and recomputed.
    Without a prefix cache the re-admission computes its prompt and outputs again; with one, its own
    freed blocks serve most of them (those hits are not prompt hits)."""
    requests = [Request(i, tuple(range(i * 100, i * 100 + 20)), 30) for i in range(2)]
    recomputed = {}
    for caching in (False, True):
        alloc = BlockManager(10, 8, prefix_caching=caching)  # 80 slots; each request grows to 50
        sim, meter = run(alloc, requests)
        assert sim.preemptions >= 1
        assert meter.prompt_tokens == 40 and meter.hit_tokens == 0
        recomputed[caching] = meter.recomputed_tokens
        if caching:
            assert alloc.cache_hit_tokens > 0  # every hit was a re-admission's
    assert recomputed[False] > 20  # the prompt and the outputs made before the preemption
    assert 0 < recomputed[True] < recomputed[False]


def test_step_columns_are_cumulative_and_match_the_run():
    rng = random.Random(3)
    base = tuple(rng.randrange(32000) for _ in range(32))
    requests = [Request(i, base + tuple(rng.randrange(32000) for _ in range(rng.randint(1, 9))), 5) for i in range(6)]
    alloc = BlockManager(200, 8)
    sim, meter = run(alloc, requests, batch=2)
    steps = meter.add_step_columns(steps_table(sim.records, "paged", "r"))
    assert list(steps.columns[-len(STEP_COLUMNS):]) == STEP_COLUMNS
    assert steps["admitted_prompt_tokens"].is_monotonic_increasing and steps["prefix_hit_tokens"].is_monotonic_increasing
    assert steps["prefix_hit_tokens"].iloc[-1] == meter.hit_tokens == 5 * 32
    assert steps["prefix_hit_rate"].iloc[-1] == pytest.approx(meter.hit_rate)
    with pytest.raises(ValueError, match="step rows"):
        meter.add_step_columns(pd.DataFrame({"t_s": [0.0]}))


def test_an_allocator_without_a_prefix_cache_reports_no_evictions():
    alloc = LaneAllocator(4, 64)
    sim, meter = run(alloc, [Request(0, (1, 2, 3), 4), Request(1, (1, 2, 3), 4)])
    assert meter.hit_rate == 0 and meter.evicted_blocks is None
