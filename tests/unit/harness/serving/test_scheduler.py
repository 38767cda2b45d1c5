"""Scheduler: admission order and limits, rejection, preemption, finishing; over the real allocators.

A small driver stands in for the engine: every admitted or decoded sequence gets one
token per step (the engine's prefill also produces the first token), then finished
sequences are released.
"""

from __future__ import annotations

from kvbench.harness.serving.scheduler import Scheduler, StepPlan
from kvbench.harness.serving.sequence import Sequence
from kvbench.harness.serving.workload import Request
from kvbench.impls.block_manager import BlockManager
from kvbench.impls.lane_allocator import LaneAllocator

BIG_BUDGET = 10_000  # max_num_batched_tokens that never binds


def request(rid: int, prompt_len: int, output_len: int, n: int = 1, arrival_s: float = 0.0) -> Request:
    """Distinct token ids per request, so a prefix cache never hits."""
    return Request(rid, tuple(range(1000 * rid, 1000 * rid + prompt_len)), output_len, n, arrival_s)


def step(sched: Scheduler) -> StepPlan:
    """One engine step: schedule, one new token per scheduled sequence, release the finished."""
    plan = sched.schedule()
    touched: list[Sequence] = [s for adm in plan.admitted for s in (adm.seq, *adm.forks)] + plan.decodes
    for s in touched:
        s.output_ids.append(7)
    sched.finish(touched)
    return plan


def admitted_ids(plan: StepPlan) -> list[int]:
    return [adm.seq.request_id for adm in plan.admitted]


def test_admits_in_arrival_order_up_to_max_num_seqs_then_decodes():
    sched = Scheduler(LaneAllocator(8, 64), max_num_seqs=3, max_num_batched_tokens=BIG_BUDGET)
    for rid in range(5):
        sched.add_request(request(rid, 4, 3))
    plan = step(sched)
    assert admitted_ids(plan) == [0, 1, 2] and plan.is_prefill and not plan.decodes
    assert [s.request_id for s, _ in sched.waiting] == [3, 4]
    plan = step(sched)  # the batch is full: a decode step over it, in admission order
    assert not plan.admitted and [s.request_id for s in plan.decodes] == [0, 1, 2]


def test_parallel_samples_count_against_max_num_seqs_and_keep_the_arrival_time():
    alloc = LaneAllocator(8, 64)
    sched = Scheduler(alloc, max_num_seqs=4, max_num_batched_tokens=BIG_BUDGET)
    sched.add_request(request(0, 5, 3, n=3, arrival_s=1.5))
    sched.add_request(request(1, 5, 3, n=2))  # 3 + 2 samples > 4: waits
    plan = sched.schedule()
    [adm] = plan.admitted
    family = [adm.seq, *adm.forks]
    assert [(s.request_id, s.sample) for s in family] == [(0, 0), (0, 1), (0, 2)]
    assert all(s.arrival_s == 1.5 and s.prompt_ids == adm.seq.prompt_ids for s in family)
    assert len({s.seq_id for s in family}) == 3 and alloc.usage().num_sequences == 3
    assert len(adm.fork_copies) == 2  # each fork's lane starts as a copy of the prompt's rows
    assert [s.request_id for s, _ in sched.waiting] == [1]


def test_token_budget_caps_a_step_except_its_first_admission_and_keeps_fifo():
    sched = Scheduler(LaneAllocator(8, 64), max_num_seqs=8, max_num_batched_tokens=10)
    for rid, prompt_len in enumerate([25, 6, 6, 2]):
        sched.add_request(request(rid, prompt_len, 5))
    assert admitted_ids(step(sched)) == [0]  # 25 > 10 runs alone rather than never
    # 6 + 6 > 10 stops the step; the 2-token prompt behind it waits its turn.
    assert admitted_ids(step(sched)) == [1]
    assert admitted_ids(step(sched)) == [2, 3]


def test_rejects_requests_that_can_never_run_without_blocking_the_queue():
    alloc = LaneAllocator(4, 8)
    sched = Scheduler(alloc, max_num_seqs=2, max_num_batched_tokens=BIG_BUDGET, max_seq_tokens=12)
    sched.add_request(request(0, 2, 2, n=3))  # more samples than the batch holds
    sched.add_request(request(1, 6, 8))  # 14 tokens at the end > 12
    sched.add_request(request(2, 9, 1))  # 10 tokens, but a 9-token prompt overflows an 8-token lane
    sched.add_request(request(3, 4, 2))
    plan = step(sched)
    assert admitted_ids(plan) == [3]
    assert [(s.request_id, why) for s, why in sched.rejected] == [
        (0, "n=3 samples exceed batch=2"),
        (1, "needs 14 KV slots; a sequence in this cache holds at most 12"),
        (2, "does not fit in an empty cache"),
    ]
    assert alloc.usage().num_sequences == 1 and not sched.waiting


def test_preempts_the_most_recently_admitted_and_requeues_it_first():
    alloc = BlockManager(3, 4, prefix_caching=False)  # three blocks: one 4-token prompt each
    sched = Scheduler(alloc, max_num_seqs=8, max_num_batched_tokens=BIG_BUDGET)
    for rid in range(3):
        sched.add_request(request(rid, 4, 6))
    assert admitted_ids(step(sched)) == [0, 1, 2]
    # Each sequence's next token needs a second block and none is free: 2 is preempted so that
    # 0 can go on; then 1, the last one left to preempt, gives up its own block.
    plan = step(sched)
    assert [s.request_id for s in plan.decodes] == [0]
    assert [s.request_id for s in plan.preempted] == [2, 1]
    assert sched.num_preemptions == 2
    assert [(s.request_id, samples) for s, samples in sched.waiting] == [(1, 1), (2, 1)]
    assert alloc.usage().num_sequences == 1
    assert not sched.rejected  # waiting for room is not a rejection
    for _ in range(100):
        if sched.done:
            break
        step(sched)
    assert sched.done and sorted(s.request_id for s in sched.finished) == [0, 1, 2]
    assert all(len(s.output_ids) == 6 for s in sched.finished)
    assert alloc.usage().num_sequences == 0 and alloc.num_free_blocks == 3


def test_finish_releases_the_lane_and_keeps_the_rest_running():
    alloc = LaneAllocator(2, 16)
    sched = Scheduler(alloc, max_num_seqs=4, max_num_batched_tokens=BIG_BUDGET)
    sched.add_request(request(0, 3, 1))  # finished by its prefill token
    sched.add_request(request(1, 3, 3))
    plan = sched.schedule()
    first, second = (adm.seq for adm in plan.admitted)
    freed = alloc.lane(first.seq_id)
    for s in (first, second):
        s.output_ids.append(7)
    sched.finish([second])  # not finished: nothing happens
    assert sched.running == [first, second] and not sched.finished
    sched.finish([first, second])
    assert sched.finished == [first] and sched.running == [second]
    assert alloc.usage().num_sequences == 1
    sched.add_request(request(2, 3, 2))
    [adm] = sched.schedule().admitted
    assert alloc.lane(adm.seq.seq_id) == freed


def test_each_allocator_states_its_longest_sequence():
    """A contiguous lane caps a sequence at max_seq_len however large the pool; a paged pool at its size."""
    from kvbench.impls.region_allocator import RegionAllocator
    from kvbench.impls.reservation import RESERVATIONS

    assert LaneAllocator(4, 8).max_sequence_tokens() == 8
    assert BlockManager(3, 4, prefix_caching=False).max_sequence_tokens() == 12
    assert RegionAllocator(100, 32, RESERVATIONS["oracle"]).max_sequence_tokens() == 32
    alloc = LaneAllocator(4, 8)
    sched = Scheduler(alloc, max_num_seqs=2, max_num_batched_tokens=BIG_BUDGET, max_seq_tokens=alloc.max_sequence_tokens())
    sched.add_request(request(0, 9, 1))
    sched.schedule()
    assert [why for _, why in sched.rejected] == ["needs 10 KV slots; a sequence in this cache holds at most 8"]


# ---- chunked prefill ---------------------------------------------------------------
def chunked_step(sched: Scheduler) -> StepPlan:
    """One engine step under chunked prefill: every decode and every last chunk (with its forks) samples."""
    plan = sched.schedule()
    touched = [*plan.decodes, *(s for c in plan.chunks if c.last for s in (c.seq, *c.admission.forks))]
    for s in touched:
        s.output_ids.append(7)
    sched.finish(touched)
    return plan


def test_chunked_prefill_decodes_first_then_chunks_under_one_budget():
    sched = Scheduler(LaneAllocator(8, 128), max_num_seqs=4, max_num_batched_tokens=10, chunked_prefill=True)
    sched.add_request(request(0, 4, 5))
    sched.add_request(request(1, 23, 5))
    sched.add_request(request(2, 3, 5))
    plan = chunked_step(sched)  # nothing decodes yet: 4 tokens of request 0, then 6 of request 1's 23
    assert plan.kind == "prefill" and [(c.seq.request_id, c.start, c.end, c.last) for c in plan.chunks] == [
        (0, 0, 4, True), (1, 0, 6, False)]
    assert [s.request_id for s, _ in sched.waiting] == [2]  # the budget is spent: no admission after a partial chunk
    plan = chunked_step(sched)  # request 0 decodes (1 token), request 1 goes on with the other 9
    assert plan.kind == "mixed" and [s.request_id for s in plan.decodes] == [0]
    assert [(c.seq.request_id, c.start, c.end) for c in plan.chunks] == [(1, 6, 15)]
    assert list(sched.prefilling) == [plan.chunks[0].seq.seq_id]  # at most one prefill under way
    plan = chunked_step(sched)  # its last 8 tokens, then request 2 is admitted with the one token left
    assert [(c.seq.request_id, c.start, c.end, c.last) for c in plan.chunks] == [(1, 15, 23, True), (2, 0, 1, False)]
    assert sum(c.num_tokens for c in plan.chunks) + len(plan.decodes) == 10
    plan = chunked_step(sched)  # requests 0 and 1 decode; request 2's last 2 tokens
    assert [s.request_id for s in plan.decodes] == [0, 1] and plan.chunks[0].last


def test_chunked_prefill_forks_wait_for_the_last_chunk():
    sched = Scheduler(LaneAllocator(8, 128), max_num_seqs=4, max_num_batched_tokens=8, chunked_prefill=True)
    sched.add_request(request(0, 20, 4, n=3))
    plan = chunked_step(sched)
    [adm] = plan.admitted
    assert len(adm.forks) == 2 and not plan.decodes and not plan.chunks[0].last
    plan = chunked_step(sched)
    assert not plan.decodes and not any(s.output_ids for s in (adm.seq, *adm.forks))
    plan = chunked_step(sched)  # the last 4 tokens: the prompt and both forks get their first token
    assert plan.chunks[0].last and all(len(s.output_ids) == 1 for s in (adm.seq, *adm.forks))
    plan = chunked_step(sched)
    assert len(plan.decodes) == 3


def test_chunked_prefill_victim_is_recomputed_and_its_unwritten_blocks_leave_the_prefix_cache():
    """A partly prefilled sequence preempted by a decode that needs memory: released (never swapped), its
    blocks past the computed tokens no longer hit, and it is prefilled again from the start."""
    alloc = BlockManager(6, 4, prefix_caching=True)
    sched = Scheduler(alloc, max_num_seqs=2, max_num_batched_tokens=4, chunked_prefill=True)
    sched.add_request(request(0, 4, 20))  # 1 block now, one more every 4 decode tokens
    sched.add_request(request(1, 16, 2))  # 4 blocks, computed in chunks of 3 beside request 0's decode
    chunked_step(sched)
    plan = chunked_step(sched)
    victim = plan.chunks[-1].seq
    assert victim.request_id == 1 and victim.seq_id in sched.prefilling
    hashed_before = set(alloc.hash_to_block.values())
    while not plan.preempted:
        plan = chunked_step(sched)
    assert plan.preempted == [victim] and victim.num_computed == 0 and victim.seq_id not in sched.prefilling
    unwritten = {b for b in hashed_before if b not in alloc.hash_to_block.values()}
    assert unwritten  # its blocks holding no K/V left the cache
    assert all(alloc.block_hash[b] is None for b in unwritten)
    alloc.check_invariants()
    while not sched.done:
        chunked_step(sched)
    assert sorted(len(s.output_ids) for s in sched.finished) == [2, 20] and victim.preempted == 1


def test_chunked_prefill_needs_a_budget_for_every_decode():
    import pytest

    with pytest.raises(ValueError, match="max_num_batched_tokens=3 must be >= batch=4"):
        Scheduler(LaneAllocator(8, 64), max_num_seqs=4, max_num_batched_tokens=3, chunked_prefill=True)
