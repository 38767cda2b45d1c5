"""Chunked prefill over an allocator that grows by chunk (the grouped pool, ``allocates_by_chunk``): a one-sample
prompt reserves its first chunk at admission and one chunk more each step, as vLLM's V1 does; when a chunk's
blocks are not free the prefill (the last admitted) is preempted and recomputed. Forks and the uniform
BlockManager reserve the whole prompt at admission, as before."""

from __future__ import annotations

from kvbench.harness.serving.scheduler import Scheduler
from kvbench.impls.attention_kinds import FullAttention, SlidingWindow
from kvbench.impls.block_manager import BlockManager
from kvbench.impls.group_pool import NULL, GroupedBlockPool, PoolGroup
from tests.unit.harness.serving.test_scheduler import chunked_step, request

GROUPS = [PoolGroup(FullAttention(), 1, 1, 0), PoolGroup(SlidingWindow(6), 1, 1, 0)]


def test_a_prompt_is_allocated_chunk_by_chunk_and_its_sliding_group_holds_about_a_window():
    pool = GroupedBlockPool([100], 4, GROUPS)
    sched = Scheduler(pool, max_num_seqs=2, max_num_batched_tokens=8, chunked_prefill=True)
    sched.add_request(request(0, 40, 3))
    for start in range(0, 40, 8):
        plan = chunked_step(sched)
        [chunk] = plan.chunks
        assert (chunk.start, chunk.end) == (start, start + 8) and pool.num_tokens(chunk.seq.seq_id) == start + 8
        sliding = pool.tables[chunk.seq.seq_id][1]
        assert len(sliding) - sliding.count(NULL) <= -(-(6 - 1 + 8) // 4) + 1  # never the whole prompt's 10
        pool.check_invariants()
    assert chunk.last and len(chunk.seq.output_ids) == 1


def test_forks_and_the_uniform_pool_reserve_the_whole_prompt():
    pool = GroupedBlockPool([100], 4, GROUPS)
    sched = Scheduler(pool, max_num_seqs=4, max_num_batched_tokens=8, chunked_prefill=True)
    sched.add_request(request(0, 40, 3, n=2))
    plan = chunked_step(sched)
    assert pool.num_tokens(plan.admitted[0].seq.seq_id) == 40 and not plan.admitted[0].grows
    bm = BlockManager(100, 4)
    sched = Scheduler(bm, max_num_seqs=2, max_num_batched_tokens=8, chunked_prefill=True)
    sched.add_request(request(0, 40, 3))
    plan = chunked_step(sched)
    assert bm.num_tokens(plan.admitted[0].seq.seq_id) == 40 and not plan.admitted[0].grows


def test_a_prefill_whose_next_chunk_finds_no_blocks_is_preempted_and_recomputed():
    pool = GroupedBlockPool([14], 4, GROUPS)
    sched = Scheduler(pool, max_num_seqs=2, max_num_batched_tokens=8, chunked_prefill=True)
    sched.add_request(request(0, 8, 30))  # 2 + 2 blocks, growing one full block every 4 decode tokens
    sched.add_request(request(1, 24, 2))  # its first chunk fits beside it; a later one does not
    plan = chunked_step(sched)
    assert [c.seq.request_id for c in plan.chunks] == [0]
    plan = chunked_step(sched)
    victim = plan.chunks[-1].seq
    assert victim.request_id == 1 and plan.admitted and pool.num_tokens(victim.seq_id) == 7
    while not plan.preempted:
        plan = chunked_step(sched)
        pool.check_invariants()
    assert plan.preempted == [victim] and victim.seq_id not in pool.tables and victim.num_computed == 0
    assert sched.waiting[0][0] is victim and sched.num_preemptions == 1
    while not sched.done:
        chunked_step(sched)
        pool.check_invariants()
    assert {s.request_id for s in sched.finished} == {0, 1} and not pool.tables
