"""Continuous batching over any ``KVAllocator``: admit, decode, preempt by recompute.

The same scheduler drives the decode scenario (one token per step, with a model)
and the capacity scenario (no model; harness/serving/simulator.py hands it only the
sequences whose next token needs memory or fills a block, and jumps between
events). Each step is either a prefill step (admit what fits, up to
``max_num_seqs`` running and ``max_num_batched_tokens`` prompt tokens to compute,
all prefilled in one forward) or a decode step (one more token for every running
sequence); when a running sequence cannot get its next slot the most recently
admitted one is preempted: its slots are freed and it is recomputed later. Under
``preemption=swap`` (an allocator built to swap, with a host tier) its blocks go to the host
instead, and it resumes where it was: a resume takes a step of its own, with the admissions of
that step (a prefill step, whose forward computes only those), and waits for its copies back.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence as Seq

from harness.serving.sequence import Sequence
from harness.serving.workload import Request
from impls.allocator import AdmitPlan, KVAllocator, SlotCopy
from impls.host_tier import NO_HOST_COPIES, HostCopies

# (sequence, number of tokens) -> the token ids whose slots are reserved this step
TokenSource = Callable[[Sequence, int], Seq[int]]


def last_token(seq: Sequence, num_tokens: int) -> list[int]:
    """Decode: the token fed this step is the last one generated."""
    assert num_tokens == 1, "a decode step feeds one token per sequence"
    return [seq.last_token]


@dataclass
class Admission:
    seq: Sequence  # to prefill from ``seq.num_cached``
    forks: list[Sequence] = field(default_factory=list)  # samples 1..n-1, sharing its prompt
    fork_copies: list[SlotCopy] = field(default_factory=list)  # apply after the prefill


@dataclass
class StepPlan:
    admitted: list[Admission] = field(default_factory=list)
    decodes: list[Sequence] = field(default_factory=list)
    copies: list[SlotCopy] = field(default_factory=list)  # apply before the decode
    preempted: list[Sequence] = field(default_factory=list)
    # Host tier (device.host_kv_gb): blocks to copy device -> host (``stores``), then host -> device
    # (``loads``), before anything else of the step; the step waits for them.
    host_copies: HostCopies = NO_HOST_COPIES
    # preemption=swap: sequences swapped back in this step (nothing to compute: they decode next step)
    resumed: list[Sequence] = field(default_factory=list)

    @property
    def is_prefill(self) -> bool:
        return bool(self.admitted or self.resumed)


class Scheduler:
    def __init__(
        self,
        allocator: KVAllocator,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        token_source: TokenSource = last_token,
        max_seq_tokens: int | None = None,
        settle: Callable[[Sequence], None] | None = None,
    ) -> None:
        self.allocator = allocator
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens  # prompt tokens computed per prefill step
        self.token_source = token_source
        self.max_seq_tokens = max_seq_tokens  # the longest sequence the allocator can hold, for never-fits checks
        # Brings a sequence's lazily counted tokens into it and the allocator before a preemption
        # releases it (the event-driven simulator); None: every sequence is always up to date.
        self.settle = settle
        self.waiting: deque[tuple[Sequence, int]] = deque()  # (sequence, samples to fork)
        self.running: list[Sequence] = []
        self.rejected: list[tuple[Sequence, str]] = []
        self.finished: list[Sequence] = []
        self.num_preemptions = 0
        self.num_swaps = 0  # preemptions by swap (the allocator swaps and its host tier had room)
        self._swapped: set[int] = set()  # seq ids waiting with their blocks in the host tier
        self.peak_running = 0
        self.max_concurrency = 0  # peak_running until the first preemption: what the budget holds resident
        self._next_id = 0

    def _new_seq(self, request_id: int, sample: int, prompt: Seq[int], max_new: int, arrival_s: float) -> Sequence:
        seq = Sequence(self._next_id, request_id, sample, prompt, max_new, arrival_s=arrival_s)
        self._next_id += 1
        return seq

    def add_request(self, req: Request) -> None:
        seq = self._new_seq(req.request_id, 0, req.prompt_ids, req.output_len, req.arrival_s)
        self.waiting.append((seq, req.n))

    @property
    def done(self) -> bool:
        return not self.waiting and not self.running

    # ---- a step ---------------------------------------------------------------
    def schedule(self, num_tokens: int = 1, candidates: Seq[tuple[Sequence, int]] | None = None) -> StepPlan:
        """Plan one step: admit what fits, else ``num_tokens`` more tokens for every running sequence
        (``candidates``: only these (sequence, tokens) append; the simulator accounts the rest)."""
        plan = StepPlan()
        self._admit(plan)
        if not plan.is_prefill:
            self._schedule_decode(plan, num_tokens, candidates)
        plan.host_copies = self.allocator.take_host_copies()  # the tier's copies this plan made
        # The allocator measures external fragmentation against the request that waits first.
        self.allocator.note_waiting(self.waiting[0][0].total_len if self.waiting else None)
        if not (plan.is_prefill or plan.decodes or plan.preempted or self.done):
            # Nothing can move: a bug, not a workload property. Fail loudly, never spin.
            raise RuntimeError(f"scheduler stalled: {len(self.waiting)} waiting, {len(self.running)} running")
        self.peak_running = max(self.peak_running, len(self.running))
        if not self.num_preemptions:
            self.max_concurrency = self.peak_running
        return plan

    def _never_fits(self, seq: Sequence, samples: int) -> str | None:
        total = seq.num_tokens + seq.remaining
        if samples > self.max_num_seqs:
            return f"n={samples} samples exceed batch={self.max_num_seqs}"
        if self.max_seq_tokens is not None and total > self.max_seq_tokens:
            return f"needs {total} KV slots; a sequence in this cache holds at most {self.max_seq_tokens}"
        return None

    def _admit(self, plan: StepPlan) -> None:
        alloc = self.allocator
        batched = 0  # tokens this step's prefill computes (prefix-cache hits are not computed)
        while self.waiting:
            seq, samples = self.waiting[0]
            if seq.seq_id in self._swapped:  # preemption=swap: resumes as it was, its blocks copied back
                # Into an empty cache without the watermark: it held these blocks before, so it never stalls.
                empty = not (self.running or plan.is_prefill)
                if len(self.running) + 1 > self.max_num_seqs or not alloc.can_swap_in(seq.seq_id, not empty):
                    break
                self.waiting.popleft()
                self._swapped.discard(seq.seq_id)
                alloc.swap_in(seq.seq_id)
                self.running.append(seq)
                plan.resumed.append(seq)
                continue
            # Planned once, only when needed (a paged plan hashes the prompt's blocks), and used
            # before the allocator changes: a plan is good only until then.
            admit_plan: AdmitPlan | None = None
            # A request that can never run is recorded as rejected, not dropped (and
            # must not block the queue forever).
            reason = self._never_fits(seq, samples)
            if reason is None and not (self.running or plan.admitted):
                admit_plan = alloc.plan_admit(seq.token_ids, samples, seq.total_len)
                if not admit_plan.fits:
                    reason = "does not fit in an empty cache"
            if reason:
                self.waiting.popleft()
                self.rejected.append((seq, reason))
                continue
            if len(self.running) + samples > self.max_num_seqs:
                break
            if admit_plan is None:
                admit_plan = alloc.plan_admit(seq.token_ids, samples, seq.total_len)
            if not admit_plan.fits:
                break
            # The first admission of a step ignores the budget: a prompt longer than it then
            # runs alone instead of waiting forever (there is no chunked prefill).
            new_tokens = seq.num_tokens - admit_plan.cached_tokens
            if plan.admitted and batched + new_tokens > self.max_num_batched_tokens:
                break
            self.waiting.popleft()
            seq.num_cached = alloc.admit(seq.seq_id, admit_plan)
            batched += seq.num_tokens - seq.num_cached
            admission = Admission(seq)
            for k in range(1, samples):
                child = self._new_seq(seq.request_id, k, seq.prompt_ids, seq.output_len, seq.arrival_s)
                admission.fork_copies += alloc.fork(seq.seq_id, child.seq_id)
                admission.forks.append(child)
            self.running += [seq, *admission.forks]
            plan.admitted.append(admission)

    def _schedule_decode(self, plan: StepPlan, num_tokens: int, candidates: Seq[tuple[Sequence, int]] | None) -> None:
        alloc, running = self.allocator, self.running  # admission order: the last admitted is preempted first
        # Victims always come off the tail, so the survivors stay a prefix of ``running``.
        gone: set[int] = set()
        for seq, k in ([(s, num_tokens) for s in running] if candidates is None else candidates):
            if gone and id(seq) in gone:
                continue
            tokens = self.token_source(seq, k)
            while (copies := alloc.try_append(seq.seq_id, tokens)) is None:  # it did not fit: nothing appended
                victim = running.pop()  # the last one after ``seq``, else ``seq`` itself
                gone.add(id(victim))
                self._preempt(victim, plan)
                if victim is seq:
                    break
            else:
                if copies:
                    plan.copies += copies
        plan.decodes = list(running)

    def _preempt(self, seq: Sequence, plan: StepPlan) -> None:
        if self.settle is not None:
            self.settle(seq)
        if self.allocator.swap_out(seq.seq_id):  # preemption=swap: its blocks wait in the host tier
            self._swapped.add(seq.seq_id)
            self.num_swaps += 1
        else:  # recompute
            self.allocator.release(seq.seq_id)
            seq.num_cached = 0
        seq.preempted += 1
        self.num_preemptions += 1
        plan.preempted.append(seq)
        self.waiting.appendleft((seq, 1))  # recomputed first, as a plain sequence

    def finish(self, seqs: Seq[Sequence]) -> None:
        """Release every finished sequence among ``seqs``."""
        done = [s for s in seqs if s.finished]
        if not done:
            return
        for s in done:
            self.allocator.release(s.seq_id)
            self.finished.append(s)
            self.running.remove(s)  # by identity (Sequence has no __eq__)
