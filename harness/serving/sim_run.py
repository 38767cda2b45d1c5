"""One event-driven simulation's state and its prefill and decode steps (harness/serving/simulator.py
describes the events). The allocator's fast path (impls/fast_path.py) tells how long each sequence
rides; an allocator without one gets the step-by-step stand-in, every sequence due at every step.
"""

from __future__ import annotations

from typing import Callable, Optional

from kvbench.harness.measure.kv_peaks import KVPeaks
from kvbench.harness.serving.after_idle import STEADY
from kvbench.harness.serving.layer_terms import Spans
from kvbench.harness.serving.scheduler import Scheduler, StepPlan
from kvbench.harness.serving.sequence import Sequence
from kvbench.harness.serving.sim_calendar import Calendar, Track, synthetic_token
from kvbench.harness.serving.sim_chunked import ChunkedSteps
from kvbench.harness.serving.sim_clock import ClockedSteps, StepClock
from kvbench.harness.serving.timeline import StepRecord
from kvbench.impls.allocator import KVAllocator
from kvbench.impls.fast_path import FastPath, fast_path

# Called after every record with its plan and the sequences that finished in it.
StepObserver = Callable[[StepRecord, StepPlan, list[Sequence]], None]


class Run(ChunkedSteps, ClockedSteps):
    """A simulation under way: the scheduler, each riding sequence's track, the calendars, the records."""

    def __init__(self, allocator: KVAllocator, max_num_seqs: int, max_num_batched_tokens: int, vocab: int,
                 bytes_per_token: int, clock: Optional[StepClock], observer: Optional[StepObserver],
                 chunked_prefill: bool = False) -> None:
        self.alloc, self.vocab, self.bpt = allocator, vocab, bytes_per_token
        self.clock, self.observer = clock, observer
        # A request's front-end cost (server, tokenize, detokenize: harness/serving/engine_profile.py) reaches the
        # user after the engine's step: its first token and its end are stamped that much later (0 offline).
        self.frontend_s = getattr(clock, "frontend_s", 0.0)
        self.sched = Scheduler(allocator, max_num_seqs, max_num_batched_tokens, token_source=self._source,
                               max_seq_tokens=allocator.max_sequence_tokens(), settle=self._settle_now,
                               chunked_prefill=chunked_prefill)
        self.tracks: dict[Sequence, Track] = {}
        self.by_id: dict[int, Sequence] = {}  # the tracked sequences by id (for the allocator's on_expose)
        # Silent fills (simulator.py's docstring): a chain hashed lazily is exposed through ``on_expose``, which is
        # not set under chunked prefill, whose admissions come after a step's decodes and would see this
        # step's fills as owed tokens (so there only a pool without prefix caching has silent fills).
        self.ride = fast_path(allocator)  # riding_steps, usage_plus_written: the allocator's, or step by step
        if isinstance(allocator, FastPath):
            allocator.on_expose = None if chunked_prefill else self._expose
        self.exposed: list[Sequence] = []  # settled by on_expose: their due steps are fixed before the next use
        self.listed: list[tuple[Sequence, int]] = []  # the step being planned's candidates, once asked
        self.rank: dict[Sequence, int] = {}  # admission order: the scheduler's running order
        self.due, self.finishing = Calendar(), Calendar()
        self.done = 0  # decode steps done
        self.synced_sum = 0  # sum of tracks' ``synced``: owed tokens = tracks * step - synced_sum
        self.admissions = 0
        self.now = 0.0
        self.peaks = KVPeaks(bytes_per_token)
        self.records: list[StepRecord] = []
        self.prefill_steps = 0
        self.idle_s = 0.0
        self.since = STEADY  # the next step's place since the engine last slept (sim_clock.py ClockedSteps)
        self.busy = False  # ``since`` counts from a busy prefill (harness/serving/after_idle.py)
        self.after_idle = getattr(clock, "after_idle", None)  # a profile's factors by place (the roofline has none)
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
        return step + self.ride.riding_steps(seq.seq_id)

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
            if tr.synced < step and tr.synced + self.ride.appendable_without_alloc(seq.seq_id) == step:
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
        tr = Track(step, self._next_due(seq, step), step + seq.remaining, synthetic_token(seq, self.vocab),
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

    def _record(self, kind: str, steps: int, batch: int, tokens: int, kv_read: int, owed: int,
                preemptions: int = 0, host_s: float = 0.0, spans: Spans = ()) -> StepRecord:
        # Before finished sequences are released, as the decode engine measures.
        usage = self.ride.usage_plus_written(owed)
        self.peaks.update(usage)
        start = duration = None
        if self.clock is not None:
            if kind == "prefill":  # a step of swap-ins alone computes nothing: only its copies
                duration = host_s + (self.clock.prefill_s(tokens, spans=spans) * self._step_factor(kind)
                                     if batch else 0.0)
            else:  # priced by each step's place since the engine slept, which the jump's steps then take
                duration = host_s + self._decode_price(batch, kv_read, steps, counted=True)
                self.since += steps
            start, self.now = self.now, self.now + duration
        rec = StepRecord(kind, steps, batch, tokens, batch if kind == "decode" else None, len(self.sched.waiting),
                         usage.used_tokens * self.bpt, usage.reserved_tokens * self.bpt, preemptions,
                         start + duration if start is not None else None, start, duration, kv_read)
        self.records.append(rec)
        return rec

    def prefill(self, plan: StepPlan) -> None:
        spans = tuple((a.seq.num_cached, a.seq.num_tokens) for a in plan.admitted)  # positions computed, each
        computed = sum(end - start for start, end in spans)
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
                           host_s=self._host_s(plan), spans=spans)
        if self.clock is not None:  # stamped as the decode engine stamps them
            for s in seqs:
                if s.admitted_s is None:
                    s.admitted_s = rec.start_s
                if s.first_token_s is None:
                    s.first_token_s = self.now + self.frontend_s
            for s in finished:
                s.finish_s = self.now + self.frontend_s
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
        first_place, busy = self.since, self.busy
        finished = self.finishing.at(last)
        finished.sort(key=self.rank.__getitem__)  # released in running order, as a real step does (LRU order)
        for s in finished:
            self._settle(s, last)
        self.done = last
        rec = self._record("decode", steps, batch, batch * steps, kv_first, self._owed(last), len(plan.preempted),
                           host_s)
        if self.clock is not None:
            self._gaps(batch, kv_first, steps, host_s, first_place=first_place, busy=busy)
            for s in finished:
                s.finish_s = self.now + self.frontend_s
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
        riding_steps, add_due = self.ride.riding_steps, self.due.add
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
        # A slab cache reads batch x the longest (allocator.py); a grouped pool (several attention kinds) counts its
        # usage in layer slots, not tokens: both read each sequence's context, one by one.
        if self.alloc.padded_decode_read or getattr(self.alloc, "usage_unit_layers", None) is not None:
            count = self.alloc.num_tokens
            return self.alloc.decode_read_tokens([count(s.seq_id) + step - tr.synced for s, tr in self.tracks.items()])
        read = self.alloc.usage().logical_tokens + self._owed(step)
        if len(self.tracks) != len(self.sched.running):
            count = self.alloc.num_tokens
            read -= sum(count(s.seq_id) for s in self.sched.running if s not in self.tracks)
        return read
