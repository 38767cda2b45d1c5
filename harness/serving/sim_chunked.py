"""The simulator's chunked-prefill step (harness/serving/simulator.py): one step of decodes and prompt chunks.

Under chunked prefill a step that computes prompt chunks (with the decodes: a mixed step) is one step of
its own, never part of a jump; the sequences whose last chunk it computed ride from it. ``ChunkedSteps``
is a part of harness/serving/sim_run.py's run, kept apart by concept: it reads and writes the run's state.
"""

from __future__ import annotations

from kvbench.harness.serving.scheduler import StepPlan
from kvbench.harness.serving.sequence import Sequence
from kvbench.harness.serving.sim_calendar import synthetic_token
from kvbench.harness.serving.timeline import StepRecord


class ChunkedSteps:
    """``mixed``: a chunked-prefill step of a run."""

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
        usage = self.ride.usage_plus_written(self._owed(self.done))
        self.peaks.update(usage)
        start = duration = None
        if clock is not None:
            spans = tuple((c.start, c.end) for c in plan.chunks)
            # a step of prompt chunks alone is a chunk by its place after a sleep (no busy prefill: after_idle.py);
            # one with decodes, a decode
            factor = self._step_factor("decode" if batch else "chunk") if batch or chunk_tokens else 1.0
            duration = host_s + (clock.mixed_s(chunk_tokens, batch, kv_read, spans) * factor
                                 if batch or chunk_tokens else 0.0)
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
                            s.first_token_s = self.now + self.frontend_s  # the engine's front-end (sim_run.py)
            for s in finished:
                s.finish_s = self.now + self.frontend_s
        if self.observer is not None:
            self.observer(rec, plan, finished)
        for s in finished:
            if s in self.tracks:
                self._drop(s)
        sched.finish(finished)
