"""Batched prefill: one varlen forward per step for every admitted prompt, under a token budget."""

from __future__ import annotations

import pytest
import torch

from kvbench.harness.serving.engine import Engine
from kvbench.harness.model.weights import build_model
from kvbench.harness.front.resolve import resolve
from kvbench.harness.serving.simulator import simulate
from kvbench.harness.serving.scheduler import Scheduler
from kvbench.harness.serving.workload import Request
from kvbench.impls.block_manager import BlockManager
from kvbench.harness.kv.factory import build_cache
from kvbench.impls.lane_allocator import LaneAllocator

GEN = torch.Generator().manual_seed(0)
PROMPTS = [torch.randint(0, 4096, (n,), generator=GEN).tolist() for n in (13, 7, 18)]
# The first and third prompts share a 32-token prefix (two blocks of 16): a paged cache finds
# the third's cached although the first prompt fills those blocks in the same forward.
SHARED = torch.randint(0, 4096, (32,), generator=GEN).tolist()
REQUESTS = [
    Request(0, tuple(SHARED + PROMPTS[0]), 5),
    Request(1, tuple(PROMPTS[1]), 5, n=2),  # parallel samples: ranked first tokens, forked rows
    Request(2, tuple(SHARED + PROMPTS[2]), 5),
]


def run_engine(compose, impl: str, max_num_batched_tokens: int):
    """The engine over REQUESTS; returns its result and the token count of every model forward."""
    cfg = resolve(compose([f"+impl={impl}", "model=tiny-llama", "dtype=float32", "device=cpu",
                           "max_seq_len=64", "block_size=16", "batch=4"]))
    model = build_model(cfg.model, torch.float32, torch.device("cpu"), cfg.seed)
    cache = build_cache(cfg.impl, cfg, 2**21, torch.device("cpu"))  # 512 tokens: 8 contiguous lanes
    forwards: list[int] = []
    model.register_forward_pre_hook(lambda _module, args: forwards.append(args[0].numel()))
    result = Engine(model, cache, cfg.batch, max_num_batched_tokens).run(REQUESTS)
    return result, forwards


@pytest.mark.parametrize("impl", ["contiguous", "paged_torch"])
def test_one_forward_prefills_every_admitted_prompt(compose, impl):
    computed = [len(r.prompt_ids) for r in REQUESTS]
    if impl == "paged_torch":
        computed[2] -= len(SHARED)  # the shared blocks are not recomputed
    batched, forwards = run_engine(compose, impl, 8192)
    # Step one admits all four sequences: one prefill forward, then one forward per decode step.
    assert forwards == [sum(computed)] + [4] * batched.decode_steps
    assert batched.prefill_tokens == sum(computed)

    # A budget of one token admits one prompt per step: one forward per prompt, as before batching.
    alone, alone_forwards = run_engine(compose, impl, 1)
    assert alone_forwards[:3] == computed
    tokens = [(s.request_id, s.sample, s.output_ids) for s in batched.sequences]
    assert tokens == [(s.request_id, s.sample, s.output_ids) for s in alone.sequences]
    assert len(tokens) == 4 and tokens[1][2] != tokens[2][2]  # the two samples diverge


def admitted_per_step(sched: Scheduler) -> list[list[int]]:
    """Prompt lengths admitted by each prefill step until the queue is empty."""
    steps = []
    while sched.waiting:
        steps.append([adm.seq.num_tokens for adm in sched.schedule().admitted])
    return steps


def test_budget_limits_a_step_and_a_longer_prompt_runs_alone():
    sched = Scheduler(LaneAllocator(8, 64), max_num_seqs=8, max_num_batched_tokens=20)
    for i, n in enumerate([8, 8, 8, 30, 5, 4]):
        sched.add_request(Request(i, tuple(range(n)), 3))
    assert admitted_per_step(sched) == [[8, 8], [8], [30], [5, 4]]


def test_budget_charges_only_tokens_missing_from_the_prefix_cache():
    prompts = [tuple(range(16)), tuple(range(16)) + (99, 98, 97, 96)]  # 16 of the 20 tokens hit
    for alloc, want in [(BlockManager(64, 4), [[16, 20]]), (LaneAllocator(8, 64), [[16], [20]])]:
        sched = Scheduler(alloc, max_num_seqs=8, max_num_batched_tokens=20)
        for i, p in enumerate(prompts):
            sched.add_request(Request(i, p, 3))
        assert admitted_per_step(sched) == want, type(alloc).__name__


def test_capacity_scenario_admits_under_the_same_budget():
    requests = [Request(i, tuple(range(10)), 3) for i in range(4)]
    unlimited = simulate(LaneAllocator(4, 64), requests, 4, 8192, 4096, 1)
    one_each = simulate(LaneAllocator(4, 64), requests, 4, 10, 4096, 1)
    assert one_each.total_steps == unlimited.total_steps + 3  # four prefill steps instead of one
    assert one_each.finished == unlimited.finished == 4


@pytest.mark.parametrize("impl", ["contiguous", "paged_torch", "paged_cuda"])
def test_engine_records_the_kv_read_the_simulator_prices(compose, impl):
    """Each decode step's ``kv_tokens_read`` (what the clocks price its attention by) is the same on
    the engine and the simulator: a slab cache (contiguous) and the paged torch reference, which gathers
    a padded window, read batch x the longest context (as a profile of paged_torch prices its simulated
    steps); the C++ kernel of paged_cuda every sequence's own context."""
    result, _ = run_engine(compose, impl, 8192)
    walls = [r.kv_tokens_read for r in result.records if r.kind == "decode"]
    alloc = LaneAllocator(8, 64) if impl == "contiguous" else BlockManager(32, 16)
    padded = impl != "paged_cuda"
    alloc.padded_decode_read = padded
    sim = simulate(alloc, REQUESTS, 4, 8192, 4096, 1)
    priced = [r.kv_tokens_read + j * r.batch for r in sim.records if r.kind == "decode" for j in range(r.steps)]
    assert walls == priced and len(walls) >= 4
    # The four sequences differ in length (46, 8, 8 and 51 tokens at the first decode): padding shows.
    lens = [len(r.prompt_ids) + 1 for r in REQUESTS for _ in range(r.n)]
    assert walls[0] == (4 * max(lens) if padded else sum(lens))
