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

``chunked_prefill=True`` schedules as vLLM's current engine does: every step is under one token budget
(``max_num_batched_tokens``), decode tokens included. A step first gives one token to every sequence whose
prefill is done, then continues the prefills under way in admission order, then admits waiting requests while
the budget lasts, each computing a chunk of its prompt (``StepPlan.chunks``). A step with decodes and chunks is
a mixed step: one forward. A prompt's blocks are all allocated at its admission (vLLM V0's chunked prefill did
so too), and only its computed chunks hold K/V; an allocator that ``allocates_by_chunk`` (the grouped pool,
whose sliding groups never hold a chunk's blocks before its window) reserves a one-sample prompt's first chunk
only and grows by one chunk each step, as vLLM's V1 does: when a chunk's blocks are not free, the prefill (the
last admitted) is preempted. A chunk short of its prompt's end uses up the step's budget, so at most one prefill
is under way between steps, the last admitted, and a later admission never finds an unwritten block of it in the
prefix cache: its hits are written by then, or in the same forward before it reads them (a cache writes every
span's K/V of a layer before attending). A partly prefilled victim is always recomputed, never swapped, and its
blocks that hold no K/V yet leave the prefix cache (``KVAllocator.drop_unwritten``), so no later prompt hits
them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence as Seq

from kvbench.harness.serving.sequence import Sequence
from kvbench.harness.serving.workload import Request
from kvbench.impls.allocator import AdmitPlan, KVAllocator, SlotCopy
from kvbench.impls.host_tier import NO_HOST_COPIES, HostCopies

# (sequence, number of tokens) -> the token ids whose slots are reserved this step
TokenSource = Callable[[Sequence, int], Seq[int]]
# The sequences a decode step appends, with their token counts: a list, or a function that gives it
Candidates = Seq[tuple[Sequence, int]] | Callable[[], Seq[tuple[Sequence, int]]]


def last_token(seq: Sequence, num_tokens: int) -> list[int]:
    """Decode: the token fed this step is the last one generated."""
    assert num_tokens == 1, "a decode step feeds one token per sequence"
    return [seq.last_token]


@dataclass
class Admission:
    seq: Sequence  # to prefill from ``seq.num_cached``
    forks: list[Sequence] = field(default_factory=list)  # samples 1..n-1, sharing its prompt
    child_copies: list[list[SlotCopy]] = field(default_factory=list)  # each fork's, applied after the prefill
    grows: bool = False  # chunked prefill: its blocks come chunk by chunk (``allocates_by_chunk``)

    @property
    def fork_copies(self) -> list[SlotCopy]:
        return [c for copies in self.child_copies for c in copies]


@dataclass(frozen=True)
class Chunk:
    """chunked_prefill: positions ``[start, end)`` of an admission's sequence computed this step; the
    chunk that reaches ``seq.num_tokens`` is its last, whose logits give the first token (and the forks')."""

    admission: Admission
    start: int
    end: int
    last: bool  # it reaches the end of the prompt (fixed when planned: the sequence grows after)

    @property
    def seq(self) -> Sequence:
        return self.admission.seq

    @property
    def num_tokens(self) -> int:
        return self.end - self.start


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
    # chunked_prefill: the prompt chunks this step computes (prefills under way, then new admissions'),
    # beside ``decodes``; ``admitted`` lists the admissions begun this step.
    chunks: list[Chunk] = field(default_factory=list)

    @property
    def is_prefill(self) -> bool:
        """The plain scheduler's prefill step (no decodes); under chunked_prefill see ``kind``."""
        return bool(self.admitted or self.resumed) and not self.decodes

    @property
    def kind(self) -> str:
        """prefill | decode | mixed (decodes and chunks in one forward, chunked_prefill only)."""
        if self.decodes:
            return "mixed" if self.chunks else "decode"
        return "prefill" if (self.chunks or self.admitted or self.resumed) else "decode"

    @property
    def chunk_tokens(self) -> int:
        return sum(c.end - c.start for c in self.chunks)


class Scheduler:
    def __init__(
        self,
        allocator: KVAllocator,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        token_source: TokenSource = last_token,
        max_seq_tokens: int | None = None,
        settle: Callable[[Sequence], None] | None = None,
        chunked_prefill: bool = False,
    ) -> None:
        self.allocator = allocator
        self.max_num_seqs = max_num_seqs
        # Prompt tokens computed per prefill step; chunked_prefill: every token of a step, decodes included.
        self.max_num_batched_tokens = max_num_batched_tokens
        self.chunked_prefill = chunked_prefill
        if chunked_prefill and max_num_batched_tokens < max_num_seqs:
            raise ValueError(f"chunked prefill: max_num_batched_tokens={max_num_batched_tokens} must be >= "
                             f"batch={max_num_seqs} (a step's budget holds one decode token per running sequence)")
        # chunked_prefill: admissions whose prompt is not all computed, by sequence id, in admission order,
        # and every sequence not ready to decode (those admissions' sequences and forks).
        self.prefilling: dict[int, Admission] = {}
        self._pending: set[int] = set()
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
    def schedule(self, num_tokens: int = 1, candidates: Candidates | None = None) -> StepPlan:
        """Plan one step: admit what fits, else ``num_tokens`` more tokens for every running sequence
        (``candidates``: only these (sequence, tokens) append, the simulator accounts the rest; given as a
        function, it is asked once the step's admissions are done, and only if the step decodes)."""
        plan = StepPlan()
        if self.chunked_prefill:
            self._schedule_decode(plan, num_tokens, candidates)
            self._schedule_chunks(plan)
        else:
            self._admit(plan)
            if not plan.is_prefill:
                self._schedule_decode(plan, num_tokens, candidates)
        plan.host_copies = self.allocator.take_host_copies()  # the tier's copies this plan made
        # The allocator measures external fragmentation against the request that waits first.
        self.allocator.note_waiting(self.waiting[0][0].total_len if self.waiting else None)
        if not (plan.is_prefill or plan.decodes or plan.chunks or plan.resumed or plan.preempted or self.done):
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

    def _resume(self, seq: Sequence, plan: StepPlan) -> bool:
        """preemption=swap: ``seq`` resumes as it was, its blocks copied back; False: not now."""
        # Into an empty cache without the watermark: it held these blocks before, so it never stalls.
        empty = not (self.running or plan.is_prefill or plan.chunks)
        if len(self.running) + 1 > self.max_num_seqs or not self.allocator.can_swap_in(seq.seq_id, not empty):
            return False
        self.waiting.popleft()
        self._swapped.discard(seq.seq_id)
        self.allocator.swap_in(seq.seq_id)
        self.running.append(seq)
        plan.resumed.append(seq)
        return True

    def _plan(self, seq: Sequence, samples: int, chunk: int | None) -> AdmitPlan:
        """``seq``'s admission plan; ``chunk`` (chunked prefill's budget): only its first chunk reserved, where
        the allocator grows by chunk and one sample prefills (a fork shares the whole prompt's blocks)."""
        if chunk is not None and samples == 1 and getattr(self.allocator, "allocates_by_chunk", False):
            return self.allocator.plan_admit(seq.token_ids, samples, seq.total_len, chunk_tokens=chunk)
        return self.allocator.plan_admit(seq.token_ids, samples, seq.total_len)

    def _plan_head(self, plan: StepPlan, chunk: int | None = None) -> AdmitPlan | bool:
        """The first waiting request's admission plan when it fits now; False when it must wait;
        True when it can never run: it is recorded as rejected, not dropped (and must not block
        the queue forever), and the caller looks at the next one."""
        seq, samples = self.waiting[0]
        # Planned once, only when needed (a paged plan hashes the prompt's blocks), and used
        # before the allocator changes: a plan is good only until then.
        admit_plan: AdmitPlan | None = None
        reason = self._never_fits(seq, samples)
        if reason is None and not (self.running or plan.admitted):
            admit_plan = self._plan(seq, samples, chunk)
            if not admit_plan.fits:
                reason = "does not fit in an empty cache"
        if reason:
            self.waiting.popleft()
            self.rejected.append((seq, reason))
            return True
        if len(self.running) + samples > self.max_num_seqs:
            return False
        if admit_plan is None:
            admit_plan = self._plan(seq, samples, chunk)
        return admit_plan if admit_plan.fits else False

    def _admit_first(self, plan: StepPlan, admit_plan: AdmitPlan) -> Admission:
        """Admit the first waiting request by ``admit_plan``, with its forks."""
        alloc = self.allocator
        seq, samples = self.waiting.popleft()
        seq.num_cached = alloc.admit(seq.seq_id, admit_plan)
        # A plan of the first chunk only says where it ends (impls/group_admission.py ``GroupAdmitPlan.end``).
        admission = Admission(seq, grows=getattr(admit_plan, "end", seq.num_tokens) < seq.num_tokens)
        for k in range(1, samples):
            child = self._new_seq(seq.request_id, k, seq.prompt_ids, seq.output_len, seq.arrival_s)
            admission.child_copies.append(alloc.fork(seq.seq_id, child.seq_id))
            admission.forks.append(child)
        self.running += [seq, *admission.forks]
        plan.admitted.append(admission)
        return admission

    def _next_admission(self, plan: StepPlan, chunk: int | None = None) -> AdmitPlan | None:
        """Swapped-out heads of the queue resumed and never-fitting ones rejected, on to the first request
        to admit: its admission plan when it fits now, else None (it, and all behind it, wait).
        ``chunk``: chunked prefill's budget left (``_plan``)."""
        while self.waiting:
            seq = self.waiting[0][0]
            if seq.seq_id in self._swapped:
                if not self._resume(seq, plan):
                    return None
                continue
            admit_plan = self._plan_head(plan, chunk)
            if admit_plan is not True:
                return admit_plan if admit_plan is not False else None
        return None

    def _admit(self, plan: StepPlan) -> None:
        batched = 0  # tokens this step's prefill computes (prefix-cache hits are not computed)
        while (admit_plan := self._next_admission(plan)) is not None:
            seq = self.waiting[0][0]
            # The first admission of a step ignores the budget: a prompt longer than it then
            # runs alone instead of waiting forever (without chunked prefill).
            new_tokens = seq.num_tokens - admit_plan.cached_tokens
            if plan.admitted and batched + new_tokens > self.max_num_batched_tokens:
                break
            self._admit_first(plan, admit_plan)
            batched += seq.num_tokens - seq.num_cached

    # ---- chunked prefill ----------------------------------------------------------
    def _schedule_chunks(self, plan: StepPlan) -> None:
        """After the decodes: the prefills under way, then new admissions, while the budget lasts."""
        budget = self.max_num_batched_tokens - len(plan.decodes)
        for adm in list(self.prefilling.values()):
            if budget <= 0:
                break
            budget -= self._chunk(plan, adm, budget)
        # As vLLM's engine: nothing new in a step that had to preempt (memory is short).
        while budget > 0 and not plan.preempted and (admit_plan := self._next_admission(plan, budget)) is not None:
            adm = self._admit_first(plan, admit_plan)
            adm.seq.num_computed = adm.seq.num_cached
            budget -= self._chunk(plan, adm, budget)

    def _chunk(self, plan: StepPlan, adm: Admission, budget: int) -> int:
        """The next chunk of ``adm``'s prefill, at most ``budget`` tokens; returns its size."""
        seq = adm.seq
        start = seq.num_computed
        end = min(seq.num_tokens, start + budget)
        if adm.grows and not self._grow(plan, adm, end):
            return 0
        plan.chunks.append(Chunk(adm, start, end, end == seq.num_tokens))
        seq.num_computed = end
        if end < seq.num_tokens:
            if seq.seq_id not in self.prefilling:
                self.prefilling[seq.seq_id] = adm
                self._pending.update(s.seq_id for s in (seq, *adm.forks))
        elif seq.seq_id in self.prefilling:  # its last chunk: it and its forks decode from the next step
            del self.prefilling[seq.seq_id]
            self._pending.difference_update(s.seq_id for s in (seq, *adm.forks))
        return end - start

    def _grow(self, plan: StepPlan, adm: Admission, end: int) -> bool:
        """The blocks of ``adm``'s prompt up to ``end``, for a chunk; False: none free, and the prefill (the last
        admitted, with no fork) is preempted, as vLLM preempts its lowest-priority request."""
        seq, alloc = adm.seq, self.allocator
        held = alloc.num_tokens(seq.seq_id)
        if end <= held or alloc.try_append(seq.seq_id, seq.token_ids[held:end]) is not None:
            return True
        self.running.remove(seq)
        self._preempt(seq, plan)
        return False

    def _schedule_decode(self, plan: StepPlan, num_tokens: int, candidates: Candidates | None) -> None:
        alloc, running = self.allocator, self.running  # admission order: the last admitted is preempted first
        # Victims always come off the tail, so the survivors stay a prefix of ``running``.
        gone: set[int] = set()
        pending = self._pending  # chunked_prefill: sequences still prefilling do not decode
        if candidates is None:
            candidates = [(s, num_tokens) for s in running if s.seq_id not in pending]
        elif callable(candidates):
            candidates = candidates()
        for seq, k in candidates:
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
        plan.decodes = [s for s in running if s.seq_id not in pending] if pending else list(running)

    def _preempt(self, seq: Sequence, plan: StepPlan) -> None:
        if self.settle is not None:
            self.settle(seq)
        if seq.seq_id in self._pending:  # chunked_prefill: preempted before its prefill was done
            self._drop_prefill(seq)
            self.allocator.release(seq.seq_id)  # never swapped: recomputed, as vLLM does
            seq.num_cached = seq.num_computed = 0
        elif self.allocator.swap_out(seq.seq_id):  # preemption=swap: its blocks wait in the host tier
            self._swapped.add(seq.seq_id)
            self.num_swaps += 1
        else:  # recompute
            self.allocator.release(seq.seq_id)
            seq.num_cached = 0
        seq.preempted += 1
        self.num_preemptions += 1
        plan.preempted.append(seq)
        self.waiting.appendleft((seq, 1))  # recomputed first, as a plain sequence

    def _drop_prefill(self, seq: Sequence) -> None:
        """A sequence whose prefill is under way leaves: its blocks past the computed frontier leave
        the prefix cache; a fork leaves its admission (its copies with it: its slots are freed)."""
        self._pending.discard(seq.seq_id)
        adm = self.prefilling.pop(seq.seq_id, None)
        if adm is not None:  # the admission's own sequence (its forks, after it in running, left first)
            self.allocator.drop_unwritten(seq.seq_id, seq.num_computed)
            return
        for adm in self.prefilling.values():
            if seq in adm.forks:
                i = adm.forks.index(seq)
                del adm.forks[i], adm.child_copies[i]
                return

    def finish(self, seqs: Seq[Sequence]) -> None:
        """Release every finished sequence among ``seqs``."""
        done = [s for s in seqs if s.finished]
        if not done:
            return
        for s in done:
            self.allocator.release(s.seq_id)
            self.finished.append(s)
            self.running.remove(s)  # by identity (Sequence has no __eq__)
