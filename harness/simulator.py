"""The scheduler and an allocator run without tensors: memory over time, at any model scale.

Shared by the capacity scenario and the max-concurrency search's bookkeeping probes.
Every sequence "generates" a synthetic token per step; steps jump ahead while no
running sequence allocates or finishes.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.measure.kv_peaks import KVPeaks
from harness.scheduler import Scheduler
from harness.sequence import Sequence
from harness.workload import Request
from impls.base import CacheStats, KVAllocator


def synthetic_token(seq: Sequence, vocab: int) -> int:
    """The token a sequence "generates" (one per sequence: only memory is simulated)."""
    return (seq.request_id * 1_000_003 + seq.sample * 7_919) % vocab


# With many sequences running, some sequence allocates or finishes at almost
# every step, so looking for a longer jump only costs time.
_JUMP_SEARCH_MAX_RUNNING = 32


@dataclass
class Simulation:
    peaks: KVPeaks
    peak_running: int
    peak_running_before_preemption: int
    preemptions: int
    rejected: list[tuple[Sequence, str]]
    steps: int
    finished: int


def simulate(
    allocator: KVAllocator,
    requests: list[Request],
    max_num_seqs: int,
    max_num_batched_tokens: int,
    vocab: int,
    bytes_per_token: int,
) -> Simulation:
    def source(seq: Sequence, k: int) -> list[int]:
        return [seq.last_token] + [synthetic_token(seq, vocab)] * (k - 1)

    capacity = allocator.usage().capacity_tokens
    sched = Scheduler(allocator, max_num_seqs, max_num_batched_tokens, token_source=source, max_seq_tokens=capacity)
    for r in requests:
        sched.add_request(r)
    peaks, steps, jump = KVPeaks(), 0, 1
    while not sched.done:
        plan = sched.schedule(jump)
        touched: list[Sequence] = []
        for adm in plan.admitted:
            for s in (adm.seq, *adm.forks):
                s.output_ids.append(synthetic_token(s, vocab))
                touched.append(s)
        for s in plan.decodes:
            s.output_ids += [synthetic_token(s, vocab)] * jump
        touched += plan.decodes
        peaks.update(CacheStats.from_usage(allocator.usage(), bytes_per_token))
        sched.finish(touched)
        steps += 1
        # Next jump: as far as every running sequence goes without allocating or finishing.
        jump = 1
        if len(sched.running) <= _JUMP_SEARCH_MAX_RUNNING:
            jump = min((min(s.remaining, allocator.tokens_until_alloc(s.seq_id)) for s in sched.running), default=1)
    return Simulation(peaks, sched.peak_running, sched.peak_running_before_preemption,
                      sched.num_preemptions, sched.rejected, steps, len(sched.finished))
