"""The event-driven simulator gives exactly what running the scheduler one step at a time gives."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.harness.serving.after_idle import MIN_IDLE_S, STEADY, AfterIdle
from kvbench.harness.serving.cost_model import CostModel, GpuSpec, ModelCost
from kvbench.harness.serving.engine_profile import EngineSpec
from kvbench.harness.measure.kv_peaks import KVPeaks
from kvbench.harness.front.job import run_job
from kvbench.harness.serving.scheduler import Scheduler
from kvbench.harness.serving.sim_calendar import synthetic_token
from kvbench.harness.serving.simulator import simulate
from kvbench.harness.serving.workload import Request
from kvbench.impls.allocator import AdmitPlan, CacheUsage, KVAllocator, SlotCopy
from kvbench.impls.block_manager import BlockManager
from kvbench.impls.lane_allocator import LaneAllocator

BPT = 1000  # bytes per token: any constant


@dataclass
class Step:
    kind: str
    batch: int
    tokens: int
    kv_read: int
    waiting: int
    reserved: int
    used: int
    start: float
    duration: float


def step_by_step(alloc, requests, max_num_seqs, max_tokens, vocab, clock=None, arrival_s=None, chunked=False):
    """The reference: the decode engine's loop without a model, one scheduler step at a time."""
    sched = Scheduler(alloc, max_num_seqs, max_tokens, max_seq_tokens=alloc.usage().pool_tokens,
                      chunked_prefill=chunked)
    times = arrival_s or [0.0] * len(requests)
    order = sorted(range(len(requests)), key=lambda i: times[i])
    now, arrived, steps, peaks = 0.0, 0, [], KVPeaks(BPT)
    after = getattr(clock, "after_idle", None)  # each step priced by its place since the last sleep
    since, busy = STEADY, False  # (or since the last busy prefill: a whole prompt's, at a place past 0)
    while True:
        while arrived < len(order) and times[order[arrived]] <= now:
            sched.add_request(requests[order[arrived]])
            arrived += 1
        if sched.done:
            if arrived == len(order):
                break
            if times[order[arrived]] - now >= MIN_IDLE_S:
                since, busy = 0, False
            now = times[order[arrived]]
            continue
        plan = sched.schedule()
        if chunked and (plan.chunks or (plan.resumed and plan.decodes)):
            # One step: the decodes (each read its whole context; a slab, the longest) and the chunks;
            # a last chunk samples.
            read = alloc.decode_read_tokens([alloc.num_tokens(s.seq_id) for s in plan.decodes])
            chunk_tokens = sum(c.end - c.start for c in plan.chunks)
            spans = tuple((c.start, c.end) for c in plan.chunks)
            tokens = len(plan.decodes) + chunk_tokens
            touched = [*plan.decodes, *(s for c in plan.chunks if c.last for s in (c.seq, *c.admission.forks))]
        elif plan.is_prefill:
            tokens = sum(a.seq.num_tokens - a.seq.num_cached for a in plan.admitted)
            spans = tuple((a.seq.num_cached, a.seq.num_tokens) for a in plan.admitted)
            read = sum(a.seq.num_tokens for a in plan.admitted)
            touched = [s for a in plan.admitted for s in (a.seq, *a.forks)]
        elif plan.decodes:
            touched = plan.decodes
            tokens = len(touched)
            lens = [alloc.num_tokens(s.seq_id) for s in touched]
            read = alloc.decode_read_tokens(lens)
            if not alloc.padded_decode_read:  # a pool's read is every sequence's context: its logical tokens
                assert chunked or read == alloc.usage().logical_tokens
        else:  # everything preempted: no forward
            peaks.update(alloc.usage())
            continue
        for s in touched:
            s.output_ids.append(synthetic_token(s, vocab))
        usage = alloc.usage()
        peaks.update(usage)
        kind = plan.kind
        duration = 0.0
        if clock is not None:
            if kind == "mixed" or (chunked and plan.chunks):
                duration = clock.mixed_s(chunk_tokens, len(plan.decodes), read, spans)
                place_kind = "decode" if plan.decodes else "chunk"
            elif plan.is_prefill:  # a step of swap-ins alone (preemption=swap) computes nothing
                duration = clock.prefill_s(tokens, spans=spans) if plan.admitted else 0.0
                place_kind = "prefill" if plan.admitted else None
            else:
                duration = clock.decode_s(len(plan.decodes), read)
                place_kind = "decode"
            if after is not None and place_kind is not None:  # a step that computes nothing takes no place
                duration *= after.step_factor(place_kind, since, busy)
                if place_kind == "prefill" and since > 0 and after.busy is not None:
                    since, busy = 1, True
                else:
                    since += 1
            if plan.host_copies:  # the step waits for its host-tier copies
                duration += clock.host_copy_s(len(plan.host_copies.stores), len(plan.host_copies.loads),
                                              alloc.block_size)
        steps.append(Step(kind, len(touched), tokens, read, len(sched.waiting), usage.reserved_tokens * BPT,
                          usage.used_tokens * BPT, now, duration))
        now += duration
        sched.finish(touched)
    return sched, steps, peaks


def assert_same(make_alloc, requests, max_num_seqs, max_tokens, vocab, clock=None, arrival_s=None, chunked=False):
    ref_alloc, alloc = make_alloc(), make_alloc()
    sched, steps, peaks = step_by_step(ref_alloc, requests, max_num_seqs, max_tokens, vocab, clock, arrival_s,
                                       chunked)
    seen = []
    sim = simulate(alloc, requests, max_num_seqs, max_tokens, vocab, BPT, clock, arrival_s,
                   observer=lambda rec, plan, done: seen.extend(done), chunked_prefill=chunked)
    assert sim.peaks == peaks
    assert (sim.peak_running, sim.max_concurrency, sim.preemptions) == (
        sched.peak_running, sched.max_concurrency, sched.num_preemptions)
    assert [(s.request_id, s.sample, why) for s, why in sim.rejected] == [
        (s.request_id, s.sample, why) for s, why in sched.rejected]
    assert sim.prefill_steps == sum(s.kind == "prefill" for s in steps)
    assert sim.decode_steps == sum(s.kind in ("decode", "mixed") for s in steps)
    assert sim.finished == len(sched.finished) == len(seen)
    assert alloc.cache_hit_tokens == ref_alloc.cache_hit_tokens
    if isinstance(alloc, BlockManager) and alloc.host is not None:
        assert alloc.host_hit_tokens == ref_alloc.host_hit_tokens
        assert (alloc.host.stored_blocks, alloc.host.loaded_blocks, alloc.swapped_out) == (
            ref_alloc.host.stored_blocks, ref_alloc.host.loaded_blocks, ref_alloc.swapped_out)
    assert sorted((s.request_id, s.sample, s.output_ids, s.preempted) for s in seen) == sorted(
        (s.request_id, s.sample, s.output_ids, s.preempted) for s in sched.finished)
    # Every record stands for exactly the steps it jumped over.
    i = 0
    for rec in sim.records:
        group = steps[i : i + rec.steps]
        i += rec.steps
        assert len(group) == rec.steps and {s.kind for s in group} == {rec.kind}
        assert all(s.batch == rec.batch for s in group) and sum(s.tokens for s in group) == rec.tokens
        assert [s.kv_read for s in group] == [rec.kv_tokens_read + j * rec.batch for j in range(rec.steps)]
        last = group[-1]
        assert (last.waiting, last.reserved, last.used) == (rec.waiting, rec.kv_reserved_bytes, rec.kv_used_bytes)
        if clock is not None:
            assert rec.start_s == pytest.approx(group[0].start, rel=1e-9, abs=1e-12)
            assert rec.duration_s == pytest.approx(sum(s.duration for s in group), rel=1e-9)
    assert i == len(steps)
    if isinstance(alloc, BlockManager):
        alloc.check_invariants()
    return sim


@st.composite
def workloads(draw):
    rng = random.Random(draw(st.integers(0, 2**32)))
    # Small vocabularies make prefix hits and identical synthetic tokens (samples 0 and 2 of a request
    # over 2 ids generate the same chain), so prefix-cache entries and their order matter.
    vocab = draw(st.sampled_from([2, 2, 5, 50, 32000]))
    paged = draw(st.booleans())
    block_size = draw(st.sampled_from([1, 2, 4, 16]))
    max_seq_len = 96
    prefix = [rng.randrange(vocab) for _ in range(rng.choice([0, 8, 40]))]
    requests = []
    for rid in range(draw(st.integers(1, draw(st.sampled_from([3, 14]))))):
        plen = rng.randint(1, 50)
        prompt = (prefix + [rng.randrange(vocab) for _ in range(plen)])[:plen] if rng.random() < 0.6 else \
            [rng.randrange(vocab) for _ in range(plen)]
        out = rng.randint(1, max_seq_len - plen)
        requests.append(Request(rid, tuple(prompt), out, rng.choice([1, 1, 2, 3])))
    longest = max(r.total_len for r in requests)
    if paged:
        need = -(-longest // block_size)
        blocks = draw(st.integers(need, 4 * need + 8))
        watermark = draw(st.sampled_from([0, 0, 1, 2]))
        caching = draw(st.booleans())
        host = draw(st.sampled_from([0, 0, 1, 4, 64]))  # a host tier under the prefix cache, in blocks
        swap = host > 0 and draw(st.booleans())  # preemption=swap, into that tier

        def make():
            return BlockManager(blocks, block_size, prefix_caching=caching, watermark_blocks=watermark,
                                host_blocks=host, swap=swap)
    else:
        lanes = draw(st.integers(1, 6))

        def make():
            return LaneAllocator(lanes, max_seq_len)
    return make, requests, draw(st.integers(1, 8)), draw(st.sampled_from([1, 16, 60, 8192])), vocab


@settings(max_examples=400, deadline=None)
@given(workloads())
def test_event_driven_equals_step_by_step(case):
    make, requests, max_num_seqs, max_tokens, vocab = case
    assert_same(make, requests, max_num_seqs, max_tokens, vocab)


# A prompt's attention priced large (roofline version 10), so that a step given the wrong positions shows.
TINY = ModelCost(params=10**9, weight_bytes=2 * 10**9, kv_bytes_per_token=10**5, num_layers=4, hidden_size=512,
                 elem_bytes=2, prefill_flops_per_pair=10**7)


def tiny_clock(count: int) -> CostModel:
    gpu = GpuSpec("test", memory_mib=24564, bandwidth_gbps=1000, tflops=100, bw_efficiency=0.5, flops_efficiency=0.5,
                  interconnect_gbps=50, interconnect_latency_us=5, count=count,
                  host_link_gbps=20, host_link_latency_us=5)
    return CostModel(gpu, TINY, engine=EngineSpec("test", step_overhead_us=100))


def chunk_budget(max_num_seqs: int, max_tokens: int) -> int:
    """A chunked-prefill budget from the drawn one: at least a decode token per running sequence."""
    return max(max_tokens, max_num_seqs)


@settings(max_examples=400, deadline=None)
@given(workloads())
def test_chunked_prefill_event_driven_equals_step_by_step(case):
    make, requests, max_num_seqs, max_tokens, vocab = case
    assert_same(make, requests, max_num_seqs, chunk_budget(max_num_seqs, max_tokens), vocab, chunked=True)


@settings(max_examples=60, deadline=None)
@given(workloads(), st.integers(0, 2**32), st.sampled_from([1, 4]), st.booleans())
def test_with_a_clock_and_arrivals_equals_step_by_step(case, seed, count, chunked):
    make, requests, max_num_seqs, max_tokens, vocab = case
    rng = random.Random(seed)
    arrivals = [rng.choice([0.0, rng.uniform(0, 0.3)]) for _ in requests]  # some at once, some spread
    if chunked:
        max_tokens = chunk_budget(max_num_seqs, max_tokens)
    sim = assert_same(make, requests, max_num_seqs, max_tokens, vocab, tiny_clock(count), arrivals, chunked)
    assert sim.elapsed_s >= max(arrivals)


class SleepyClock(CostModel):
    """tiny_clock's prices with after-idle factors (a profile's, harness/serving/after_idle.py), steep ones."""

    after_idle = AfterIdle(1.7, ((1, 1.9), (2, 1.3), (3, 1.1), (4, 1.0), (8, 0.95), (16, 0.9), (32, 0.8)))


class BusyClock(CostModel):
    """SleepyClock's factors, and a busy prefill's curve (a prefill between decode steps, after_idle.py)."""

    after_idle = AfterIdle(1.7, SleepyClock.after_idle.decode, AfterIdle(1.4, ((1, 1.6), (2, 1.2), (5, 1.0))))


@settings(max_examples=60, deadline=None)
@given(workloads(), st.integers(0, 2**32), st.booleans(), st.sampled_from([SleepyClock, BusyClock]))
def test_each_step_is_priced_by_its_place_after_a_sleep_as_step_by_step(case, seed, chunked, kind):
    """A jump's price is the sum of its steps' own, each times its place's factor: the jumps split where the
    factor changes, and end before an arrival by those prices; a busy prefill starts its own count."""
    make, requests, max_num_seqs, max_tokens, vocab = case
    rng = random.Random(seed)
    arrivals = [rng.choice([0.0, rng.uniform(0, 0.3)]) for _ in requests]
    if chunked:
        max_tokens = chunk_budget(max_num_seqs, max_tokens)
    plain = tiny_clock(1)
    clock = kind(plain.gpu, TINY, engine=EngineSpec("test", step_overhead_us=100))
    assert_same(make, requests, max_num_seqs, max_tokens, vocab, clock, arrivals, chunked)


def test_a_prefill_between_decode_steps_costs_the_busy_factor_and_the_steps_after_it_the_busy_places():
    requests = [Request(0, tuple(range(40)), 50), Request(1, tuple(range(30)), 20)]
    plain = tiny_clock(1)
    clock = BusyClock(plain.gpu, TINY, engine=EngineSpec("test", step_overhead_us=100))
    base = simulate(BlockManager(100, 16), requests, 4, 4096, 32000, BPT, plain, [0.5, 0.5005])
    # the second arrives while the first decodes, never after a sleep: its prefill is a busy one
    arrive = next(r for r in base.records if r.kind == "decode").start_s + 0.0001
    sim = simulate(BlockManager(100, 16), requests, 4, 4096, 32000, BPT, clock, [0.5, arrive])
    base = simulate(BlockManager(100, 16), requests, 4, 4096, 32000, BPT, plain, [0.5, arrive])
    pre, plain_pre = ([r for r in run.records if r.kind == "prefill"] for run in (sim, base))
    assert [r.duration_s for r in pre] == pytest.approx([1.7 * plain_pre[0].duration_s,
                                                         1.4 * plain_pre[1].duration_s], rel=1e-9)
    after = [r for r in sim.records if r.kind == "decode" and r.start_s > pre[1].start_s]
    plain_after = [r for r in base.records if r.kind == "decode" and r.start_s > plain_pre[1].start_s]
    kv = after[0].kv_tokens_read
    steps = sum(r.steps for r in after if r.batch == 2)
    priced = sum(plain.decode_s(2, kv + 2 * j) * clock.after_idle.decode_factor(1 + j, busy=True) for j in range(steps))
    assert sum(r.duration_s for r in after if r.batch == 2) == pytest.approx(priced, rel=1e-9)
    assert plain_after[0].batch == 2 and steps == 19  # the second's 19 decode steps, beside the first's


def test_the_steps_after_a_sleep_cost_their_factors_and_a_busy_stretch_its_last():
    requests = [Request(0, tuple(range(40)), 50), Request(1, tuple(range(40)), 50)]
    plain = tiny_clock(1)
    clock = SleepyClock(plain.gpu, TINY, engine=EngineSpec("test", step_overhead_us=100))
    # the second request arrives long after the first finished: two sleeps (the first before any arrival)
    sim = simulate(BlockManager(100, 16), requests, 4, 4096, 32000, BPT, clock, [0.5, 5.0])
    base = simulate(BlockManager(100, 16), requests, 4, 4096, 32000, BPT, plain, [0.5, 5.0])
    prefills = [r.duration_s for r in sim.records if r.kind == "prefill"]
    assert prefills == pytest.approx([1.7 * r.duration_s for r in base.records if r.kind == "prefill"], rel=1e-9)
    first = [r for r in sim.records if r.kind == "decode" and r.start_s < 5.0]
    kv = first[0].kv_tokens_read
    priced = sum(plain.decode_s(1, kv + j) * clock.after_idle.decode_factor(1 + j) for j in range(49))
    assert sum(r.steps for r in first) == 49
    assert sum(r.duration_s for r in first) == pytest.approx(priced, rel=1e-9)
    # a burst at t=0 never sleeps: every step is a steady one
    burst = simulate(BlockManager(100, 16), requests[:1], 4, 4096, 32000, BPT, clock, [0.0])
    plain_burst = simulate(BlockManager(100, 16), requests[:1], 4, 4096, 32000, BPT, plain, [0.0])
    assert burst.records[0].duration_s == pytest.approx(plain_burst.records[0].duration_s, rel=1e-9)
    assert burst.records[1].duration_s == pytest.approx(0.8 * plain_burst.records[1].duration_s, rel=1e-9)


def test_a_decode_run_jumps_between_events():
    """Fixed lengths in step: per block of 16 tokens, one record for the step that takes the next block and
    the 15 after it, not one per token. The fills are silent (each prompt's chain is its own, hashed lazily)."""
    requests = [Request(i, tuple(range(i, i + 100)), 400) for i in range(8)]
    sim = assert_same(lambda: BlockManager(1000, 16), requests, 8, 8192, 32000)
    assert sim.decode_steps == 399 and len(sim.records) <= 1 + (-(-399 // 16) + 1)


@pytest.mark.parametrize("caching", [True, False])
def test_a_silent_fill_is_no_event(caching):
    """A block whose fill nobody can see (no prefix caching, or a chain its sequence holds alone) costs no
    record of its own: one a block, where a fill that a lookup could hit costs two (a shared prompt's chain)."""
    alone = [Request(0, tuple(range(100)), 64)]
    shared = alone + [Request(1, tuple(range(100)), 64)]  # its chain is a hit: hashed eagerly, fills are events
    one = assert_same(lambda: BlockManager(100, 16, prefix_caching=caching), alone, 1, 8192, 32000)
    two = assert_same(lambda: BlockManager(100, 16, prefix_caching=caching), shared, 2, 8192, 32000)
    blocks = -(-(100 + 63) // 16) - -(-100 // 16)  # the blocks its decode takes: 4, so 5 stretches of steps
    assert len(one.records) == 1 + (blocks + 1)  # the prefill, then a record a stretch
    assert len(two.records) == 1 + (blocks + 1 + (blocks if caching else 0))  # and one a fill, with caching


def test_a_silently_filled_block_is_a_hit_once_a_prompt_reaches_its_chain():
    """C waits behind A and B (the batch is full) while A's second block fills silently at decode step 4; when
    C is first looked up, its hit on A's first block makes the allocator expose A's chain (``on_expose``):
    A's owed tokens come in before the lookup goes on, so C finds both blocks, as step by step."""
    a = Request(0, (5, 6, 7, 8), 12)  # request 0 makes token 0
    b = Request(1, (1, 2), 6)
    c = Request(2, (5, 6, 7, 8, 0, 0, 0, 0, 9), 2)
    sim = assert_same(lambda: BlockManager(40, 4), [a, b, c], 2, 8192, 32000)
    assert sim.records[5].kind == "prefill"  # C's, after B finished at decode step 5


def test_a_chain_exposed_mid_step_takes_the_fill_its_turn_made():
    """Y's first block fills at decode step 1 with X's first block's contents (request 1 makes token 3 in a
    vocabulary of 10**6), so registering it shares X's chain, in the middle of step 1's appends, after X's
    turn, whose token (owed: X was not due) filled X's second block. The simulator brings that fill in once
    the step is planned, and Z, admitted when Y finishes, finds X's two blocks, as step by step."""
    x = Request(0, (3, 3, 3, 3, 7, 7, 7), 6)  # request 0 makes token 0
    y = Request(1, (3, 3, 3), 3)
    z = Request(2, (3, 3, 3, 3, 7, 7, 7, 0, 5), 2)
    allocs = []

    def make():
        allocs.append(BlockManager(40, 4))
        return allocs[-1]

    assert_same(make, [x, y, z], 2, 8192, 1_000_000)
    assert allocs[1].cache_hit_tokens == 8


def test_a_block_filled_by_decode_is_a_prefix_hit_at_the_next_step():
    """B's prompt continues A's prompt with A's own output tokens (request 0 makes token 0): once
    A's second block fills (decode step 2), B finds it cached and fits (step 3), not before."""
    a = Request(0, (5, 6, 7, 8, 9, 10), 6)
    b = Request(1, (5, 6, 7, 8, 9, 10, 0, 0, 11), 2)
    sim = assert_same(lambda: BlockManager(3, 4), [a, b], 2, 8192, 32000)
    kinds = [(r.kind, r.steps, r.tokens) for r in sim.records[:4]]
    assert kinds == [("prefill", 1, 6), ("decode", 1, 1), ("decode", 1, 1), ("prefill", 1, 1)]


def test_arrival_times_need_a_clock():
    with pytest.raises(ValueError, match="clock"):
        simulate(LaneAllocator(1, 8), [Request(0, (1,), 1)], 1, 8, 10, 1, arrival_s=[0.0])


@pytest.mark.parametrize("chunked", [[], ["chunked_prefill=true", "max_num_batched_tokens=24"]], ids=["whole", "chunked"])
def test_capacity_counts_the_decode_engines_steps(compose, tmp_path, chunked):
    """The same scheduler: a capacity run and a real decode run (tiny model, same KV pool) take the
    same steps, preempt the same sequences and hold the same memory; with chunked prefill too."""
    common = ["+impl=paged_torch", "model=tiny-llama", "dtype=float32", "device=cpu", "max_seq_len=128",
              "batch=6", "workload.num_requests=10", "workload.prompt_len=40", "workload.output_len=24",
              "device.kv_cache_gb=0.0006", *chunked]
    (decode,), code = run_job(compose(["scenario=decode", "scenario.warmup=0", *common]), tmp_path / "decode")
    assert code == 0, decode.get("error")
    clock = ["gpu=h100-sxm"] if chunked else []  # a priced run writes its steps table
    (capacity,), code = run_job(compose(["scenario=capacity", "scenario.concurrency_points=[1]", *common, *clock]),
                                tmp_path / "capacity")
    assert code == 0, capacity.get("error")
    assert decode["preemptions"] > 0  # the pool is tight enough to matter
    for key in ("decode_steps", "preemptions", "peak_concurrency", "max_concurrency", "kv_bytes_reserved",
                "kv_bytes_used", "cache_hit_tokens"):
        assert capacity[key] == decode[key], key
    if chunked:  # step by step, kind by kind: the engine's steps table is the simulator's, expanded
        import pandas as pd

        wall = pd.read_parquet(tmp_path / "decode" / "steps.parquet")
        sim = pd.read_parquet(tmp_path / "capacity" / "steps.parquet")
        expanded = sim.loc[sim.index.repeat(sim["steps"])]
        assert "mixed" in set(wall["kind"]) and list(expanded["kind"]) == list(wall["kind"])
        single = sim["steps"] == 1
        assert list(sim[single]["tokens"]) == list(wall[wall.index.isin(
            (sim["steps"].cumsum() - 1)[single])]["tokens"])


# ---- the reuse workloads (harness/serving/conversations.py, system_prompts.py, hash_blocks.py) ----------

def _reuse_workload(kind: str, seed: int):
    from kvbench.harness.config import WorkloadConfig
    from kvbench.harness.serving.workload import draw_workload

    w = WorkloadConfig(name=kind, kind=kind, distribution="uniform", prompt_len=20, output_len=9, spread=0.6,
                       users=4, turns=3, think_time_s=0.02, system_prompts=3, system_prompt_len=24)
    return draw_workload(w, 12, 32000, 96, seed)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("blocks", [14, 40, 400])  # few blocks: evictions and preemptions; many: none
def test_system_prompt_workload_equals_step_by_step(seed, blocks):
    requests = _reuse_workload("system_prompt", seed).requests
    assert_same(lambda: BlockManager(blocks, 4), requests, 5, 64, 32000)
    rng = random.Random(seed)
    arrivals = [rng.uniform(0, 0.05) for _ in requests]
    assert_same(lambda: BlockManager(blocks, 4), requests, 5, 64, 32000, tiny_clock(1), arrivals)


def test_hash_block_prompts_equal_step_by_step():
    """Mooncake-style prompts: token ids drawn from hash ids of 8-token blocks, prefixes shared by id."""
    import numpy as np

    from kvbench.harness.serving.hash_blocks import HashBlockTokens

    blocks = HashBlockTokens(8, 32000, 0, lambda ids: ids.tolist())
    rng, draw = random.Random(1), np.random.Generator(np.random.PCG64(1))
    requests = []
    for rid in range(14):
        ids = [0, 1, 2][:rng.randint(0, 3)] + [100 + rid * 10 + k for k in range(rng.randint(1, 3))]
        length = rng.randint(max(1, 8 * (len(ids) - 1) + 1), 8 * len(ids))
        requests.append(Request(rid, tuple(blocks.prompt(ids, length, draw)), rng.randint(1, 20)))
    for n_blocks in (12, 30, 300):
        sim = assert_same(lambda: BlockManager(n_blocks, 4), requests, 4, 64, 32000)
        assert sim.finished + len(sim.rejected) == len(requests)


def step_by_step_closed_loop(alloc, source, max_num_seqs, max_tokens, vocab, clock):
    """The reference for a closed loop: one scheduler step at a time, finishes stamped at the step's
    end and told to the source."""
    sched = Scheduler(alloc, max_num_seqs, max_tokens, max_seq_tokens=alloc.usage().pool_tokens)
    now, steps = 0.0, 0
    while True:
        for req in source.due(now):
            sched.add_request(req)
        if sched.done:
            nxt = source.next_arrival()
            if nxt is None:
                break
            now = nxt
            continue
        plan = sched.schedule()
        if plan.is_prefill:
            spans = tuple((a.seq.num_cached, a.seq.num_tokens) for a in plan.admitted)
            touched = [s for a in plan.admitted for s in (a.seq, *a.forks)]
            duration = clock.prefill_s(sum(b - a for a, b in spans), spans=spans)
        elif plan.decodes:
            touched = plan.decodes
            duration = clock.decode_s(len(touched), alloc.usage().logical_tokens)
        else:
            continue
        for s in touched:
            s.output_ids.append(synthetic_token(s, vocab))
        now += duration
        steps += 1
        done = [s for s in touched if s.finished]
        for s in done:
            s.finish_s = now
        source.finished(done)
        sched.finish(touched)
    return sched, now


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("blocks", [18, 60, 500])
def test_a_closed_loop_equals_step_by_step(seed, blocks):
    """multi_turn on the simulated clock: the same turns arrive at the same times, finish at the same
    times and hit the same cached blocks as in the step-by-step loop; no turn arrives before its
    predecessor finished plus its think time."""
    from kvbench.harness.serving.closed_loop import ClosedLoopSource

    wl = _reuse_workload("multi_turn", seed)
    firsts = [0.01 * u for u in range(len(wl.conversations))]

    def source():
        return ClosedLoopSource(wl.requests, wl.conversations, wl.think_s, firsts)

    ref_alloc, alloc = BlockManager(blocks, 4), BlockManager(blocks, 4)
    ref_src, src = source(), source()
    sched, ref_end = step_by_step_closed_loop(ref_alloc, ref_src, 5, 64, 32000, tiny_clock(1))
    sim = simulate(alloc, [], 5, 64, 32000, BPT, tiny_clock(1), source=src)
    assert sim.elapsed_s == pytest.approx(ref_end, rel=1e-9)
    assert [r.request_id for r in src.released] == [r.request_id for r in ref_src.released]
    assert [r.arrival_s for r in src.released] == pytest.approx([r.arrival_s for r in ref_src.released], rel=1e-9)
    ref_fin = {s.request_id: s.finish_s for s in sched.finished}
    fin = {s.request_id: s.finish_s for s in sim.sequences}
    assert fin.keys() == ref_fin.keys() and [fin[k] for k in fin] == pytest.approx([ref_fin[k] for k in fin], rel=1e-9)
    assert alloc.cache_hit_tokens == ref_alloc.cache_hit_tokens and sim.preemptions == sched.num_preemptions
    arrived = {r.request_id: r.arrival_s for r in src.released}
    for ids in wl.conversations:
        for prev, cur in zip(ids, ids[1:]):
            if cur in arrived:
                assert arrived[cur] >= fin[prev] + wl.think_s[cur] - 1e-12
    rejected = {s.request_id for s, _ in sim.rejected}
    assert len(fin) + len(rejected) == len(src.released)
    alloc.check_invariants()


def test_a_source_excludes_a_request_list():
    from kvbench.harness.serving.request_source import OpenLoopSource

    with pytest.raises(ValueError, match="not both"):
        simulate(LaneAllocator(1, 8), [Request(0, (1,), 1)], 1, 8, 10, 1, source=OpenLoopSource([]))


class TokenPool(KVAllocator):
    """A cache kind with the narrow interface alone (no ``FastPath``): one slot per token from a free list,
    a fork copies. The simulator runs it step by step."""

    def __init__(self, num_slots: int) -> None:
        self.num_slots, self.free, self.held = num_slots, list(range(num_slots - 1, -1, -1)), {}

    def plan_admit(self, token_ids, num_samples=1, total_len=None) -> AdmitPlan:
        fits = len(token_ids) * num_samples <= len(self.free)  # each fork copies the prompt
        return AdmitPlan(token_ids, num_samples, total_len, 0, fits, self.generation)

    def admit(self, seq_id, plan) -> int:
        self._check_plan(plan)
        self.held[seq_id] = [self.free.pop() for _ in plan.token_ids]
        self.generation += 1
        return 0

    def can_append(self, seq_id, num_tokens=1) -> bool:
        return num_tokens <= len(self.free)

    def append(self, seq_id, token_ids) -> list[SlotCopy]:
        assert self.can_append(seq_id, len(token_ids))
        self.held[seq_id] += [self.free.pop() for _ in token_ids]
        self.generation += 1
        return []

    def fork(self, parent_id, child_id) -> list[SlotCopy]:
        src = self.held[parent_id]
        self.held[child_id] = [self.free.pop() for _ in src]
        self.generation += 1
        return [SlotCopy(s, d, 1) for s, d in zip(src, self.held[child_id])]

    def release(self, seq_id) -> None:
        self.free += reversed(self.held.pop(seq_id))
        self.generation += 1

    def slots(self, seq_id, start, end) -> list[int]:
        return self.held[seq_id][start:end]

    def num_tokens(self, seq_id) -> int:
        return len(self.held[seq_id])

    def usage(self) -> CacheUsage:
        n = sum(map(len, self.held.values()))
        return CacheUsage(self.num_slots, n, n, n, 0, 0, len(self.held), len(self.free))


@settings(max_examples=150, deadline=None)
@given(workloads(), st.integers(0, 200), st.booleans())
def test_a_kind_without_the_fast_path_runs_step_by_step(case, extra, chunked):
    """The narrow interface is enough: the same figures as the scheduler stepped one step at a time, each
    record one step; and, without forks, the same as a paged pool of one-token blocks without a prefix cache."""
    _, requests, max_num_seqs, max_tokens, vocab = case
    slots = max(r.total_len for r in requests) + extra
    budget = chunk_budget(max_num_seqs, max_tokens) if chunked else max_tokens
    sim = assert_same(lambda: TokenPool(slots), requests, max_num_seqs, budget, vocab, chunked=chunked)
    assert all(rec.steps == 1 for rec in sim.records)
    if all(r.n == 1 for r in requests):
        paged = simulate(BlockManager(slots, 1, prefix_caching=False), requests, max_num_seqs, budget, vocab, BPT,
                         chunked_prefill=chunked)
        assert (paged.peaks, paged.preemptions, paged.total_steps, paged.finished) == (
            sim.peaks, sim.preemptions, sim.total_steps, sim.finished)
