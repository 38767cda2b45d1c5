"""The scheduler and an allocator run without tensors, event by event: memory (and, with a clock, time).

Shared by the capacity scenario and the max-concurrency search's bookkeeping probes.
Every sequence "generates" a synthetic token per step (a fixed function of its request
and sample). The figures are exactly those of running ``Scheduler`` one step at a time
(tests/unit/harness/serving/test_simulator.py checks it against that loop), but the work follows events, not
batch x steps:

- A running sequence is *due* at the decode step whose token fills its block (which then
  enters the prefix cache) and at the one whose token needs memory (a new block or a
  copy-on-write: ``appendable_without_alloc`` has run out). Only due sequences go to the
  scheduler, in running order, which checks, appends and preempts them exactly as in a
  real decode step; so every allocation and every prefix-cache entry happens in the same
  order as step by step.
- A fill that nobody can see (``KVAllocator.fill_is_silent``: no prefix caching, or a chain that only
  its own sequence holds, hashed lazily) is not an event: the sequence rides through it to the step
  that needs memory, which appends the fill's tokens with its own. If a lookup is about to reach such a
  chain (a waiting prompt hits its first block), the allocator calls ``on_expose`` first, and the
  sequence's owed tokens come in before the lookup reads the chain; from then on its fills are events.
  Half the events of a long decode at scale (issue 25's 100,000 requests: 3.3 million appends to 1.7).
- Between its due steps a sequence *rides*: its tokens, which need no memory and fill no
  block, are owed, not appended. It appends them with its next due token, or when it
  finishes or is preempted; meanwhile the memory figures count them (``usage_plus_written``).
- Steps where nobody is due, finishes or arrives decide nothing new, so one ``StepRecord``
  stands for ``steps`` of them (a jump); a clock prices the jump in closed form.
- Under chunked prefill a step that computes prompt chunks (with the decodes: a mixed step) is one
  step of its own, never part of a jump; the sequences whose last chunk it computed ride from it.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol, Sequence as Seq

from harness.measure.kv_peaks import KVPeaks
from harness.serving.request_source import OpenLoopSource, RequestSource
from harness.serving.scheduler import Scheduler, StepPlan
from harness.serving.sequence import Sequence
from harness.serving.timeline import StepRecord
from harness.serving.workload import Request, gc_paused
from impls.allocator import KVAllocator


def synthetic_token(seq: Sequence, vocab: int) -> int:
    """The token a sequence "generates" (one per sequence: only memory is simulated)."""
    return (seq.request_id * 1_000_003 + seq.sample * 7_919) % vocab


class StepClock(Protocol):
    """Prices steps (harness/serving/cost_model.py's ``CostModel``)."""

    def prefill_s(self, tokens: int) -> float: ...

    def decode_s(self, batch: int, kv_tokens_read: int, steps: int = 1) -> float:
        """The price of a record's steps (a profiled clock counts those outside its profile)."""

    def decode_price_s(self, batch: int, kv_tokens_read: int, steps: int = 1) -> float:
        """``decode_s``, counting nothing: asked while a jump's end is searched."""

    def decode_steps_s(self, batch: int, kv_tokens_read: int, steps: int) -> list[float]:
        """Each step's own price, ``decode_price_s(batch, kv_tokens_read + j*batch)`` for j < steps."""

    def mixed_s(self, tokens: int, batch: int, kv_tokens_read: int) -> float: ...

    def host_copy_s(self, stores: int, loads: int, block_tokens: int) -> float: ...


@dataclass
class Simulation:
    peaks: KVPeaks
    peak_running: int
    max_concurrency: int  # the most sequences running at once before the first preemption
    preemptions: int
    rejected: list[tuple[Sequence, str]]
    prefill_steps: int
    decode_steps: int  # model decode steps (a jump of k counts k), as the decode engine counts them
    finished: int
    records: list[StepRecord] = field(default_factory=list)
    elapsed_s: Optional[float] = None  # simulated time, with a clock
    idle_s: float = 0.0  # simulated time with nothing arrived and nothing running
    sequences: list[Sequence] = field(default_factory=list)  # with a clock: the finished ones, timed
    # With a clock: every inter-token gap, as (gap seconds, how many sequences had it); see _Run.decode.
    itl: tuple[list[float], list[int]] = field(default_factory=lambda: ([], []))

    @property
    def steps(self) -> int:
        return self.prefill_steps + self.decode_steps


# Called after every record with its plan and the sequences that finished in it.
StepObserver = Callable[[StepRecord, StepPlan, list[Sequence]], None]


@dataclass(slots=True)
class _Track:
    """A running sequence's lazy state; step numbers count decode steps from the start."""

    synced: int  # its tokens are in the allocator (and output_ids) up to this step
    due: int  # the step whose token needs memory
    finish: int  # the step that makes its last token
    token: int
    base: int  # the allocator's tokens of it less ``synced`` (constant, but inside a step's planning)


class _Calendar:
    """Sequences by the step of their next event; the earliest step in O(log n)."""

    def __init__(self) -> None:
        self._at: dict[int, dict[Sequence, None]] = {}
        self._keys: list[int] = []

    def add(self, step: int, seq: Sequence) -> None:
        bucket = self._at.get(step)
        if bucket is None:
            self._at[step] = bucket = {}
            heapq.heappush(self._keys, step)
        bucket[seq] = None

    def discard(self, step: int, seq: Sequence) -> None:
        bucket = self._at.get(step)
        if bucket is not None:
            bucket.pop(seq, None)
            if not bucket:
                del self._at[step]

    def at(self, step: int) -> list[Sequence]:
        return list(self._at.get(step, ()))

    def clear(self, step: int) -> None:
        self._at.pop(step, None)

    def first(self) -> Optional[int]:
        while self._keys and self._keys[0] not in self._at:
            heapq.heappop(self._keys)
        return self._keys[0] if self._keys else None


class _Run:
    def __init__(self, allocator: KVAllocator, max_num_seqs: int, max_num_batched_tokens: int, vocab: int,
                 bytes_per_token: int, clock: Optional[StepClock], observer: Optional[StepObserver],
                 chunked_prefill: bool = False) -> None:
        self.alloc, self.vocab, self.bpt = allocator, vocab, bytes_per_token
        self.clock, self.observer = clock, observer
        self.sched = Scheduler(allocator, max_num_seqs, max_num_batched_tokens, token_source=self._source,
                               max_seq_tokens=allocator.max_sequence_tokens(), settle=self._settle_now,
                               chunked_prefill=chunked_prefill)
        self.tracks: dict[Sequence, _Track] = {}
        self.by_id: dict[int, Sequence] = {}  # the tracked sequences by id (for the allocator's on_expose)
        # Silent fills (module docstring): a chain hashed lazily is exposed through ``on_expose``, which is
        # not set under chunked prefill, whose admissions come after a step's decodes and would see this
        # step's fills as owed tokens (so there only a pool without prefix caching has silent fills).
        allocator.on_expose = None if chunked_prefill else self._expose
        self.exposed: list[Sequence] = []  # settled by on_expose: their due steps are fixed before the next use
        self.listed: list[tuple[Sequence, int]] = []  # the step being planned's candidates, once asked
        self.rank: dict[Sequence, int] = {}  # admission order: the scheduler's running order
        self.due, self.finishing = _Calendar(), _Calendar()
        self.done = 0  # decode steps done
        self.synced_sum = 0  # sum of tracks' ``synced``: owed tokens = tracks * step - synced_sum
        self.admissions = 0
        self.now = 0.0
        self.peaks = KVPeaks(bytes_per_token)
        self.records: list[StepRecord] = []
        self.prefill_steps = 0
        self.idle_s = 0.0
        # With a clock: inter-token gaps as (seconds, count). The prefills since the last decode
        # record stall every running sequence: (duration, sequences that prefill started).
        self.itl_gaps: list[float] = []
        self.itl_counts: list[int] = []
        self._stalls: list[tuple[float, int]] = []

    def _source(self, seq: Sequence, k: int) -> list[int]:
        """The tokens a due sequence appends at the step planned: its last one, then those it made
        meanwhile, all the same synthetic token; as many as it owes then (``k``, unless ``on_expose``
        brought some in since the candidates were listed)."""
        return [seq.output_ids[-1]] * (self.done + 1 - self.tracks[seq].synced)

    # ---- lazy tokens -----------------------------------------------------------
    def _settle(self, seq: Sequence, step: int) -> None:
        """Append the tokens ``seq`` owes up to ``step`` (none needs memory; only a silent fill's fill a block)."""
        tr = self.tracks[seq]
        owed = step - tr.synced
        if owed > 0:
            toks = [tr.token] * owed
            self.alloc.append(seq.seq_id, toks)
            seq.output_ids += toks
            tr.synced = step
            self.synced_sum += owed

    def _settle_now(self, seq: Sequence) -> None:  # the scheduler's hook, before it preempts ``seq``
        if seq in self.tracks:  # (a sequence still prefilling owes nothing)
            self._settle(seq, self.done)

    def _owed(self, step: int) -> int:
        """Tokens the riding sequences owe at the end of ``step``."""
        return len(self.tracks) * step - self.synced_sum

    def _next_due(self, seq: Sequence, step: int) -> int:
        """After ``step``: the next step that needs memory, else the one that fills the block (unless
        that fill is silent: then the step after it, which needs a block)."""
        return step + self.alloc.riding_steps(seq.seq_id)

    def _expose(self, seq_id: int) -> None:
        """The allocator is about to hash a chain ``seq_id`` filled silently: its tokens up to the last
        step done come in now (a step being planned appends its own later, at the sequence's turn; one
        whose turn has come has them all in, though ``synced`` says so only once the step is planned)."""
        seq = self.by_id.get(seq_id)
        if seq is None:
            return
        tr = self.tracks[seq]
        if self.alloc.num_tokens(seq_id) - tr.base == tr.synced:  # its turn this step has not come
            self._settle(seq, self.done)
        self.exposed.append(seq)

    def _fix_exposed(self, step: int) -> None:
        """Each exposed sequence's fills are events from now: its next due step again. ``step``: the last
        step whose decode appends are made; a sequence exposed while it was planned, whose block that step
        fills, appends the fill now (its turn in it has passed: nobody else holds that chain yet)."""
        exposed, self.exposed = self.exposed, []
        for seq in exposed:
            tr = self.tracks.get(seq)
            if tr is None:  # finished or preempted since
                continue
            if tr.synced < step and tr.synced + self.alloc.appendable_without_alloc(seq.seq_id) == step:
                self._settle(seq, step)
            due = self._next_due(seq, tr.synced)
            if due != tr.due:
                self.due.discard(tr.due, seq)
                tr.due = due
                self.due.add(due, seq)

    def candidates(self) -> list[tuple[Sequence, int]]:
        """The sequences the next decode step appends (those due then), in running order, with the tokens
        each owes then, kept as ``listed``; the scheduler asks once its admissions are done, which may
        expose some."""
        first = self.done + 1
        if self.exposed:
            self._fix_exposed(self.done)
        due = self.due.at(first)
        due.sort(key=self.rank.__getitem__)  # the scheduler's running order
        tracks = self.tracks
        self.listed = [(s, first - tracks[s].synced) for s in due]
        return self.listed

    def _track(self, seq: Sequence) -> None:
        """A sequence just prefilled (its first token made): ride until due or finished."""
        step = self.done
        tr = _Track(step, self._next_due(seq, step), step + seq.remaining, synthetic_token(seq, self.vocab),
                    self.alloc.num_tokens(seq.seq_id) - step)
        self.tracks[seq] = tr
        self.by_id[seq.seq_id] = seq
        self.rank[seq] = self.admissions
        self.admissions += 1
        self.synced_sum += step
        self.due.add(tr.due, seq)
        self.finishing.add(tr.finish, seq)

    def _drop(self, seq: Sequence) -> None:
        tr = self.tracks.pop(seq)
        del self.rank[seq]
        del self.by_id[seq.seq_id]
        self.synced_sum -= tr.synced
        self.due.discard(tr.due, seq)
        self.finishing.discard(tr.finish, seq)

    # ---- steps -----------------------------------------------------------------
    def _host_s(self, plan: StepPlan) -> float:
        """The plan's host-tier copies: its first step waits for them (cost_model.py host_copy_s)."""
        copies = plan.host_copies
        if not copies or self.clock is None:
            return 0.0
        return self.clock.host_copy_s(len(copies.stores), len(copies.loads), self.alloc.block_size)

    def _record(self, kind: str, steps: int, batch: int, tokens: int, kv_read: int, owed: int,
                preemptions: int = 0, host_s: float = 0.0) -> StepRecord:
        # Before finished sequences are released, as the decode engine measures.
        usage = self.alloc.usage_plus_written(owed)
        self.peaks.update(usage)
        start = duration = None
        if self.clock is not None:
            if kind == "prefill":  # a step of swap-ins alone computes nothing: only its copies
                duration = host_s + (self.clock.prefill_s(tokens) if batch else 0.0)
            else:
                duration = host_s + self.clock.decode_s(batch, kv_read, steps)
            start, self.now = self.now, self.now + duration
        rec = StepRecord(kind, steps, batch, tokens, batch if kind == "decode" else None, len(self.sched.waiting),
                         usage.used_tokens * self.bpt, usage.reserved_tokens * self.bpt, preemptions,
                         start + duration if start is not None else None, start, duration, kv_read)
        self.records.append(rec)
        return rec

    def prefill(self, plan: StepPlan) -> None:
        computed = sum(a.seq.num_tokens - a.seq.num_cached for a in plan.admitted)
        seqs = [s for a in plan.admitted for s in (a.seq, *a.forks)]
        for s in seqs:
            s.output_ids.append(synthetic_token(s, self.vocab))
        finished = [s for s in seqs if s.finished]
        # The step's new running sequences, in running order: resumed ones (preemption=swap, swapped back
        # in with their tokens as they were) ride from here as a sequence just prefilled does.
        for s in self.sched.running[len(self.sched.running) - len(seqs) - len(plan.resumed):]:
            if not s.finished:
                self._track(s)
        self.prefill_steps += 1
        context = sum(a.seq.num_tokens - 1 for a in plan.admitted)
        rec = self._record("prefill", 1, len(seqs), computed, context, self._owed(self.done),
                           host_s=self._host_s(plan))
        if self.clock is not None:  # stamped as the decode engine stamps them
            for s in seqs:
                if s.admitted_s is None:
                    s.admitted_s = rec.start_s
                if s.first_token_s is None:
                    s.first_token_s = self.now
            for s in finished:
                s.finish_s = self.now
            self._stalls.append((rec.duration_s, len(seqs) - len(finished) + len(plan.resumed)))
        if self.observer is not None:
            self.observer(rec, plan, finished)
        self.sched.finish(finished)

    def decode(self, plan: StepPlan, due: list[tuple[Sequence, int]], next_arrival: Optional[float]) -> None:
        """The step the scheduler just planned (each ``due`` sequence appended its owed tokens and
        this step's), then as many more as change nothing."""
        first = self.done + 1
        self._appended(plan, due, first)
        batch = len(plan.decodes)
        host_s = self._host_s(plan)  # host-tier copies: before the jump's first step, which waits for them
        if not batch:  # every sequence was preempted: no forward, nothing generated
            self.peaks.update(self.alloc.usage())
            self.now += host_s
            return
        kv_first = self._decode_read(first)
        # Jump: end where someone finishes, stop before someone is due, and (with a clock) before
        # a request arrives. A step that filled a block (a new prefix-cache entry, which a waiting
        # request may hit) ends the jump too: the filler is due at the next step. So must a step
        # that preempted: the memory it freed may let the next step admit.
        last = self.finishing.first()
        next_due = self.due.first()
        if next_due is not None:
            last = min(last, next_due - 1)
        if plan.preempted:
            last = first
        steps = last - self.done
        if next_arrival is not None:
            steps = self._until(next_arrival, batch, kv_first, steps, host_s)
        last = self.done + steps
        finished = self.finishing.at(last)
        finished.sort(key=self.rank.__getitem__)  # released in running order, as a real step does (LRU order)
        for s in finished:
            self._settle(s, last)
        self.done = last
        rec = self._record("decode", steps, batch, batch * steps, kv_first, self._owed(last), len(plan.preempted),
                           host_s)
        if self.clock is not None:
            self._gaps(batch, kv_first, steps, host_s)
            for s in finished:
                s.finish_s = self.now
        if self.observer is not None:
            self.observer(rec, plan, finished)
        for s in finished:
            self._drop(s)
        self.sched.finish(finished)

    def _appended(self, plan: StepPlan, due: list[tuple[Sequence, int]], first: int) -> None:
        """After the scheduler planned decode step ``first``: the preempted leave, and every ``due``
        sequence that appended its owed tokens and this step's is synced and due again later."""
        tracks = self.tracks
        for s in plan.preempted:
            if s in tracks:  # (a sequence preempted while prefilling was never tracked)
                self._drop(s)
        self.due.clear(first)  # every sequence due now was appended, or preempted and dropped
        riding_steps, add_due = self.alloc.riding_steps, self.due.add
        owed = 0
        for s, _ in due:
            tr = tracks.get(s)
            if tr is None:  # preempted
                continue
            k = first - tr.synced  # (``on_expose`` may have brought some in since the list was made)
            s.output_ids += [tr.token] * k
            tr.synced = first
            owed += k
            tr.due = due_at = first + riding_steps(s.seq_id)
            add_due(due_at, s)
        self.synced_sum += owed
        if self.exposed:
            self._fix_exposed(first)

    def _decode_read(self, step: int) -> int:
        """KV tokens step ``step``'s decode attention reads: every riding sequence's context, which
        the allocator's logical tokens hold (plus what they owe), less the sequences not decoding:
        those whose prefill is under way or just done (chunked prefill) and those just swapped in."""
        if self.alloc.padded_decode_read:  # a slab cache: batch x the longest (allocator.py)
            count = self.alloc.num_tokens
            return self.alloc.decode_read_tokens([count(s.seq_id) + step - tr.synced for s, tr in self.tracks.items()])
        read = self.alloc.usage().logical_tokens + self._owed(step)
        if len(self.tracks) != len(self.sched.running):
            count = self.alloc.num_tokens
            read -= sum(count(s.seq_id) for s in self.sched.running if s not in self.tracks)
        return read

    def mixed(self, plan: StepPlan, due: list[tuple[Sequence, int]]) -> None:
        """chunked_prefill: one step of decodes (if any) and prompt chunks (if any), and swap-ins."""
        sched, clock = self.sched, self.clock
        batch = len(plan.decodes)
        first = self.done + 1
        self._appended(plan, due, first)
        kv_read = self._decode_read(first) if batch else 0
        ready = 0  # sequences that start to decode after this step: last chunks' (forks too), swapped in
        for c in plan.chunks:
            if c.last:
                for s in (c.seq, *c.admission.forks):
                    s.output_ids.append(synthetic_token(s, self.vocab))
                    ready += 1
        ready += len(plan.resumed)
        if batch:
            self.done = first
        finished = self.finishing.at(first) if batch else []
        finished.sort(key=self.rank.__getitem__)
        for s in finished:
            self._settle(s, first)
        # The newly ready sequences are the last ones in running that are neither riding nor prefilling.
        fresh: list[Sequence] = []
        pending = sched._pending
        for s in reversed(sched.running):
            if len(fresh) == ready:
                break
            if s not in self.tracks and s.seq_id not in pending:
                fresh.append(s)
        fresh.reverse()
        started = [s for s in fresh if not s.finished]
        for s in started:
            self._track(s)
        finished += [s for s in fresh if s.finished]
        chunk_tokens = plan.chunk_tokens
        if plan.chunks:
            self.prefill_steps += not batch
        host_s = self._host_s(plan)
        kind = plan.kind
        touched = batch + sum(1 + len(c.admission.forks) for c in plan.chunks if c.last)
        # Like the decode engine's record: before finished sequences are released.
        usage = self.alloc.usage_plus_written(self._owed(self.done))
        self.peaks.update(usage)
        start = duration = None
        if clock is not None:
            duration = host_s + (clock.mixed_s(chunk_tokens, batch, kv_read) if batch or chunk_tokens else 0.0)
            start, self.now = self.now, self.now + duration
        rec = StepRecord(kind, 1, touched, batch + chunk_tokens, len(sched.running),
                         len(sched.waiting), usage.used_tokens * self.bpt, usage.reserved_tokens * self.bpt,
                         len(plan.preempted), self.now if clock is not None else None, start, duration, kv_read)
        self.records.append(rec)
        if clock is not None:
            if batch:
                self._gaps(batch, kv_read, 1, durations=[duration])
            else:
                self._stalls.append((duration, 0))
            self._stalls.append((0.0, len(started)))  # they wait only for the steps after this one
            for c in plan.chunks:
                if c.seq.admitted_s is None:
                    c.seq.admitted_s = start
            for c in plan.chunks:
                if c.last:
                    for s in (c.seq, *c.admission.forks):
                        if s.admitted_s is None:
                            s.admitted_s = c.seq.admitted_s
                        if s.first_token_s is None:
                            s.first_token_s = self.now
            for s in finished:
                s.finish_s = self.now
        if self.observer is not None:
            self.observer(rec, plan, finished)
        for s in finished:
            if s in self.tracks:
                self._drop(s)
        sched.finish(finished)

    def _gaps(self, batch: int, kv_first: int, steps: int, host_s: float = 0.0,
              durations: Optional[list[float]] = None) -> None:
        """The inter-token gaps of a decode record: its first step's token follows each sequence's
        previous one across the prefills since the last decode record (a sequence those prefills
        started waited only for the later ones); every later step's gap is that step's duration,
        for all ``batch`` sequences. A preempted sequence's stall shows in its E2EL, not here."""
        clock, gaps, counts = self.clock, self.itl_gaps, self.itl_counts
        if durations is None:  # priced, not counted again: the record's decode_s counted these steps
            durations = clock.decode_steps_s(batch, kv_first, steps)
            durations[0] += host_s
        started = min(batch, sum(n for _, n in self._stalls))
        stall = sum(d for d, _ in self._stalls)
        if batch - started:
            gaps.append(durations[0] + stall)
            counts.append(batch - started)
        for i, (d, n) in enumerate(self._stalls):  # those started by prefill i wait for the prefills after it
            n = min(n, started)
            started -= n
            if n:
                gaps.append(durations[0] + sum(d2 for d2, _ in self._stalls[i + 1:]))
                counts.append(n)
        self._stalls.clear()
        for d in durations[1:]:
            gaps.append(d)
            counts.append(batch)

    def _until(self, arrival: float, batch: int, kv_first: int, most: int, host_s: float = 0.0) -> int:
        """Fewest steps (<= ``most``) after which the clock has reached ``arrival``: no later step
        of the jump may start at or after it, since that step would admit it."""
        price = self.clock.decode_price_s  # a search: its prices are not steps priced, so not counted

        def reached(k: int) -> bool:
            return self.now + host_s + price(batch, kv_first, k) >= arrival

        if not reached(most):
            return most
        lo, hi = 1, most
        while lo < hi:
            mid = (lo + hi) // 2
            if reached(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo


def simulate(
    allocator: KVAllocator,
    requests: list[Request],
    max_num_seqs: int,
    max_num_batched_tokens: int,
    vocab: int,
    bytes_per_token: int,
    clock: Optional[StepClock] = None,
    arrival_s: Optional[Seq[float]] = None,
    observer: Optional[StepObserver] = None,
    source: Optional[RequestSource] = None,
    chunked_prefill: bool = False,
) -> Simulation:
    """Run ``requests`` to completion. With ``clock`` every record is priced and ``arrival_s``
    (seconds, one per request) holds each request back until then; ``observer`` sees every
    record with the scheduler's plan and the sequences that finished in it. ``source``: the
    requests come from it instead (harness/serving/request_source.py; e.g. a closed loop)."""
    if arrival_s is not None and clock is None:
        raise ValueError("arrival times need a clock to compare them with")
    if source is not None and (requests or arrival_s is not None):
        raise ValueError("requests come from the source or from the list, not both")
    # The run allocates millions of small objects and makes no reference cycles: the cyclic
    # collector would only rescan every live request again and again.
    with gc_paused():
        if source is None:  # a burst: all at once, in list order
            source = OpenLoopSource(requests, arrival_s if arrival_s is not None else [0.0] * len(requests))
        return _simulate(allocator, source, max_num_seqs, max_num_batched_tokens, vocab, bytes_per_token,
                         clock, observer, chunked_prefill)


def _told(source: RequestSource, observer: Optional[StepObserver]) -> StepObserver:
    """An observer that tells ``source`` of each record's finished sequences, then calls ``observer``."""
    def observe(rec: StepRecord, plan: StepPlan, finished: list[Sequence]) -> None:
        if finished:
            source.finished(finished)
        if observer is not None:
            observer(rec, plan, finished)
    return observe


def _simulate(allocator, source, max_num_seqs, max_num_batched_tokens, vocab, bytes_per_token, clock,
              observer, chunked_prefill=False) -> Simulation:
    run = _Run(allocator, max_num_seqs, max_num_batched_tokens, vocab, bytes_per_token, clock, _told(source, observer),
               chunked_prefill)
    sched = run.sched
    while True:
        for req in source.due(run.now):
            sched.add_request(req)
        next_arrival = source.next_arrival()
        if sched.done:
            if next_arrival is None:
                break
            run.idle_s += next_arrival - run.now
            run.now = next_arrival  # idle until the next request
            continue
        run.listed = []
        plan = sched.schedule(1, candidates=run.candidates)  # asked once admissions are done, if it decodes
        if plan.chunks or (plan.resumed and plan.decodes):  # chunked prefill: a step of its own
            run.mixed(plan, run.listed)
        elif plan.is_prefill:
            run.prefill(plan)
        else:
            run.decode(plan, run.listed, next_arrival)
    allocator.on_expose = None  # the run is over: nothing owes tokens any more
    timed = clock is not None
    return Simulation(run.peaks, sched.peak_running, sched.max_concurrency, sched.num_preemptions,
                      sched.rejected, run.prefill_steps, run.done, len(sched.finished), run.records,
                      run.now if timed else None, run.idle_s, list(sched.finished) if timed else [],
                      (run.itl_gaps, run.itl_counts))
