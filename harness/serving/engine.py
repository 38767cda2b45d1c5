"""The decode engine: continuous batching of real model forwards over one KV cache.

Knows nothing about which impl it runs: it asks the scheduler for a step, applies
the copies the allocator asked for, and runs one model forward per step: a varlen
prefill of every prompt admitted in the step (their new tokens concatenated, logits
only at each prompt's last token) or a batched decode of all running sequences. Each
layer attends through the cache's ``forward_prefill`` or ``forward_decode``, which the
engine picks once per step. Under ``chunked_prefill`` a step may compute prompt chunks beside the
decodes (a mixed step): still one forward, whose layers attend the decode rows through
``forward_decode`` and the chunks' rows through ``forward_prefill`` (each impl keeps its own decode
kernel), as vLLM's engine did when it ran a prefill and a decode kernel over one batch.
Greedy sampling; sample ``k`` of a request with ``n > 1`` takes the ``k``-th ranked
token first (so parallel samples diverge and copy-on-write is exercised), then
continues greedily.

A forward's integer inputs (token ids, positions, and the cache's metadata) go to
the device in one copy: the engine adds its fields to a ``StagingBuffer`` and the
cache's ``prepare_*`` adds its own and uploads it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from kvbench.harness.model.compiled import CompiledDecode
from kvbench.harness.model.llama import LlamaModel
from kvbench.harness.model.piecewise import PiecewiseDecode
from kvbench.harness.serving.request_source import OpenLoopSource, RequestSource, tell_rejected
from kvbench.harness.serving.scheduler import Admission, Scheduler, StepPlan
from kvbench.harness.serving.served_run import ServedRun
from kvbench.harness.serving.simulator import StepObserver
from kvbench.harness.serving.sequence import Sequence
from kvbench.harness.serving.timeline import StepRecord
from kvbench.harness.serving.workload import Request
from kvbench.harness.measure.kv_peaks import KVPeaks
from kvbench.impls.base import KVCache, PrefillSpan, StepAttention
from kvbench.impls.staging import StagingBuffer

# (the sequences of a step, their logits rows) -> the token each one is fed next
Sampler = Callable[[list[Sequence], torch.Tensor], list[int]]


@dataclass
class EngineResult(ServedRun):
    """A wall-clock run: the record the simulator's run shares (harness/serving/served_run.py), and its times."""

    prefill_tokens: int  # tokens actually computed in prefills (cache hits excluded)
    step_s: list[float]  # wall time of every decode step
    host_s: list[float]  # host time of every decode step: from its start until the forward is enqueued
    memory_bound_steps: int = 0  # decode steps with room in the batch while an arrived request waited for KV
    cache_counters: dict[str, int] = field(default_factory=dict)  # KVCache.counters(): its tensors' own events
    piecewise_steps: int = 0  # decode steps run as pieces (CUDA graphs on a GPU)
    prefill_step_s: list[float] = field(default_factory=list)  # wall time of every prefill step


@dataclass
class _RunState:
    """What one ``Engine.run`` accumulates, step by step."""

    t0: float  # perf_counter at the start: the run's clock reads from here
    peaks: KVPeaks
    now: float = 0.0  # when the last step's tokens were out
    prefill_tokens: int = 0
    idle_s: float = 0.0
    memory_bound_steps: int = 0
    step_s: list[float] = field(default_factory=list)
    host_s: list[float] = field(default_factory=list)
    prefill_step_s: list[float] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)

    def clock(self) -> float:
        return time.perf_counter() - self.t0


class Engine:
    def __init__(
        self,
        model: LlamaModel,
        cache: KVCache,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        sync: Callable[[], None] = lambda: None,
        progress: Callable[[int], None] | None = None,
        pieces: PiecewiseDecode | None = None,
        sampler: Sampler | None = None,
        compiled: CompiledDecode | None = None,
        chunked_prefill: bool = False,
    ) -> None:
        self.model = model
        # Picks each step's next tokens from its logits rows; None: greedy (argmax), as every timed run.
        # A teacher-forced run (harness/serving/forced.py) feeds given tokens and reads the rows instead.
        self.sampler = sampler
        # Decode steps of at most pieces.max_batch sequences run as pieces (CUDA graphs on a GPU)
        # around the cache's attention; larger ones, and every prefill, run the model eagerly.
        self.pieces = pieces
        # cpu_compile: every decode step runs the compiled graph (harness/model/compiled.py), the
        # cache's attention eager inside it.
        self.compiled = compiled
        self.piecewise_steps = 0
        self.cache = cache
        self.max_num_seqs = max_num_seqs
        self.sync = sync  # waits for the device, so step times are real
        self.progress = progress
        self.device = next(model.parameters()).device
        sinks = model.layer_sinks()
        if sinks is not None:  # gpt-oss: each layer's learned sinks join its softmax, in the cache's kernels
            cache.set_layer_sinks(sinks)
        cache.warmup()  # JIT compiles happen here, never inside the timed loop
        self.scheduler = Scheduler(cache.allocator, max_num_seqs, max_num_batched_tokens,
                                   max_seq_tokens=cache.allocator.max_sequence_tokens(),
                                   chunked_prefill=chunked_prefill)

    def _forward(self, staging: StagingBuffer, ids: int, positions: int, attend: Callable[..., torch.Tensor],
                 meta: Any, logits_at: int | None = None):
        """The model over staged ``ids`` and ``positions`` (``staging`` uploaded); every layer attends
        through ``attend`` (the cache's ``forward_prefill`` or ``forward_decode``) with ``meta``."""
        at = staging[logits_at] if logits_at is not None else None
        return self.model(staging[ids], staging[positions], StepAttention(self.cache, [(attend, meta, None)]), at)

    def _decode_forward(self, staging: StagingBuffer, ids: int, positions: int, meta: Any, batch: int):
        if self.compiled is not None:
            decode = self.cache.forward_decode
            return self.compiled(staging[ids], staging[positions], lambda layer, q, k, v: decode(layer, q, k, v, meta))
        if self.pieces is None or batch > self.pieces.max_batch:
            return self._forward(staging, ids, positions, self.cache.forward_decode, meta)
        self.piecewise_steps += 1
        decode = self.cache.forward_decode
        return self.pieces(staging[ids], staging[positions], lambda layer, q, k, v: decode(layer, q, k, v, meta))

    def _prefill(self, admitted: list[Admission]) -> int:
        """One forward over every admitted prompt's uncached tokens; returns how many it computed."""
        spans = [PrefillSpan(a.seq.seq_id, a.seq.num_cached, a.seq.num_tokens) for a in admitted]
        ids: list[int] = []
        positions: list[int] = []
        last: list[int] = []  # each prompt's last row of the batch: the only logits sampled
        for adm, span in zip(admitted, spans):
            ids += adm.seq.token_ids[span.start : span.end]
            positions += range(span.start, span.end)
            last.append(len(ids) - 1)
        staging = StagingBuffer(self.device)
        ids_h, positions_h, last_h = staging.add(ids), staging.add(positions), staging.add(last)
        meta = self.cache.prepare_prefill(spans, staging)
        logits = self._forward(staging, ids_h, positions_h, self.cache.forward_prefill, meta, last_h)
        if self.sampler is not None:
            if any(adm.forks for adm in admitted):
                raise ValueError("a sampler feeds one token per request: parallel sampling (n > 1) is not supported")
            for adm, tok in zip(admitted, self.sampler([adm.seq for adm in admitted], logits)):
                adm.seq.output_ids.append(tok)
            return len(ids)
        for adm, row in zip(admitted, logits):
            self._first_tokens(adm, row)
        return len(ids)

    @staticmethod
    def _first_tokens(adm: Admission, row: torch.Tensor) -> None:
        """A prompt's first token, and its forks': sample ``k`` takes the ``k``-th ranked one."""
        forks = adm.forks
        ranked = torch.topk(row, 1 + len(forks)).indices.tolist() if forks else [int(row.argmax())]
        for rank, s in enumerate([adm.seq, *forks]):
            s.output_ids.append(ranked[rank])

    @torch.inference_mode()
    def run(self, requests: list[Request], source: RequestSource | None = None,
            observer: StepObserver | None = None) -> EngineResult:
        """Serve ``requests`` on the wall clock: each is admitted only once it has arrived. ``source``:
        the requests come from it instead (e.g. a closed loop); ``observer`` sees every step's record
        with its plan and the sequences that finished in it (as the simulator's does)."""
        sched, cache = self.scheduler, self.cache
        if source is None:
            source = OpenLoopSource(requests)  # stable: a burst keeps request order
        run = _RunState(time.perf_counter(), KVPeaks(cache.bytes_per_token))
        self.piecewise_steps = 0
        told = 0  # rejections the source was told of
        while source.next_arrival() is not None or not sched.done:
            now = run.clock()
            for req in source.due(now):
                sched.add_request(req)
            if sched.done:  # nothing has arrived and nothing runs: wait for the next arrival
                time.sleep(max(0.0, source.next_arrival() - now))
                run.idle_s += run.clock() - now
                continue
            ts = time.perf_counter()
            preempted_before = sched.num_preemptions
            plan = sched.schedule()
            told = tell_rejected(source, sched.rejected, told, run.clock())
            if plan.host_copies:  # host tier (device.host_kv_gb): done first, inside the step's time
                cache.copy_host(plan.host_copies)
            if plan.chunks:  # chunked_prefill: prompt chunks, with the decodes if any (a mixed step)
                kind, touched, computed = plan.kind, *self._chunked_step(plan, ts, run)
            elif plan.is_prefill:
                kind, touched, computed = "prefill", *self._prefill_step(plan.admitted, ts, run)
            elif plan.decodes:
                kind, touched, computed = "decode", *self._decode_step(plan, ts, run)
            else:  # every running sequence was preempted: nothing to compute this step
                continue
            self._record(run, kind, touched, computed, sched.num_preemptions - preempted_before, ts, plan.decodes)
            finished = [s for s in touched if s.finished]
            if finished:
                source.finished(finished)
            if observer is not None:
                observer(run.steps[-1], plan, finished)
            sched.finish(touched)
        self.sync()
        return self._result(run, time.perf_counter() - run.t0)

    def _prefill_step(self, admitted: list[Admission], ts: float, run: _RunState) -> tuple[list[Sequence], int]:
        """Every admitted prompt in one forward; the forks' slots copied once their parents are written."""
        if not admitted:  # preemption=swap: a step of swap-ins alone (their copies are done): no forward
            return [], 0
        computed = self._prefill(admitted)
        run.prefill_tokens += computed
        self.cache.copy_slots([c for adm in admitted for c in adm.fork_copies])
        self.sync()
        run.prefill_step_s.append(time.perf_counter() - ts)
        now = run.clock()
        touched: list[Sequence] = []
        for adm in admitted:
            for s in (adm.seq, *adm.forks):
                if s.admitted_s is None:
                    s.admitted_s = ts - run.t0
                if s.first_token_s is None:
                    s.first_token_s = now
                s.token_s.append(now)
            touched += [adm.seq, *adm.forks]
        run.now = now
        return touched, computed

    def _decode_step(self, plan: StepPlan, ts: float, run: _RunState) -> tuple[list[Sequence], int]:
        """One token for every running sequence, in one batched forward."""
        self.cache.copy_slots(plan.copies)
        seqs = plan.decodes
        staging = StagingBuffer(self.device)
        ids = staging.add([s.output_ids[-1] for s in seqs])
        positions = staging.add([s.num_tokens - 1 for s in seqs])
        meta = self.cache.prepare_decode([s.seq_id for s in seqs], staging)
        logits = self._decode_forward(staging, ids, positions, meta, len(seqs))
        run.host_s.append(time.perf_counter() - ts)  # enqueued; on a GPU nothing has waited for it yet
        chosen = self.model.greedy(logits) if self.sampler is None else self.sampler(seqs, logits)
        for s, tok in zip(seqs, chosen):
            s.output_ids.append(tok)
        self.sync()
        run.step_s.append(time.perf_counter() - ts)
        run.now = now = run.clock()
        for s in seqs:
            s.token_s.append(now)
        if self.progress:
            self.progress(len(seqs))
        sched = self.scheduler
        if sched.waiting and len(sched.running) + sched.waiting[0][1] <= self.max_num_seqs:
            run.memory_bound_steps += 1  # batch had room, yet nothing was admitted: the KV budget
        return seqs, len(seqs)

    def _chunked_step(self, plan: StepPlan, ts: float, run: _RunState) -> tuple[list[Sequence], int]:
        """The decodes (if any) and every prompt chunk in one forward; a last chunk samples its first
        token (and its forks'), whose slots are copied once the prompt is all written."""
        self.cache.copy_slots(plan.copies)
        decodes, chunks = plan.decodes, plan.chunks
        ids = [s.output_ids[-1] for s in decodes]
        positions = [s.num_tokens - 1 for s in decodes]
        rows = list(range(len(decodes)))  # the rows whose logits are sampled: every decode, each last chunk's end
        for c in chunks:
            ids += c.seq.token_ids[c.start : c.end]
            positions += range(c.start, c.end)
            if c.last:
                rows.append(len(ids) - 1)
        spans = [PrefillSpan(c.seq.seq_id, c.start, c.end) for c in chunks]
        staging = StagingBuffer(self.device)
        ids_h, positions_h, rows_h = staging.add(ids), staging.add(positions), staging.add(rows)
        if decodes:
            # Two metadata uploads: the decode's with the step's own fields, then the chunks'.
            decode_meta = self.cache.prepare_decode([s.seq_id for s in decodes], staging)
            prefill_meta = self.cache.prepare_prefill(spans, StagingBuffer(self.device))
            cache = self.cache
            # the decodes' rows first, then the chunks': each part attends its own through its kernel
            attend = StepAttention(cache, [(cache.forward_decode, decode_meta, len(decodes)),
                                           (cache.forward_prefill, prefill_meta, None)])
            logits = self.model(staging[ids_h], staging[positions_h], attend, staging[rows_h])
        else:
            meta = self.cache.prepare_prefill(spans, staging)
            logits = self._forward(staging, ids_h, positions_h, self.cache.forward_prefill, meta, rows_h)
        if decodes:  # host_s goes with step_s: the steps that decode
            run.host_s.append(time.perf_counter() - ts)
        finishing = [c.admission for c in chunks if c.last]
        sampled = [*decodes, *(a.seq for a in finishing)]
        if self.sampler is not None:
            if any(a.forks for a in finishing):
                raise ValueError("a sampler feeds one token per request: parallel sampling (n > 1) is not supported")
            chosen = self.sampler(sampled, logits)
            for s, tok in zip(sampled, chosen):
                s.output_ids.append(tok)
        else:
            for s, tok in zip(decodes, self.model.greedy(logits[: len(decodes)])):
                s.output_ids.append(tok)
            for adm, row in zip(finishing, logits[len(decodes):]):
                self._first_tokens(adm, row)
        self.cache.copy_slots([c for adm in finishing for c in adm.fork_copies])
        self.sync()
        (run.step_s if decodes else run.prefill_step_s).append(time.perf_counter() - ts)
        now = run.clock()
        run.prefill_tokens += sum(c.num_tokens for c in chunks)
        touched = list(decodes)
        for s in decodes:
            s.token_s.append(now)
        for c in chunks:
            if c.seq.admitted_s is None:
                c.seq.admitted_s = ts - run.t0
        for adm in finishing:
            for s in (adm.seq, *adm.forks):
                if s.admitted_s is None:
                    s.admitted_s = adm.seq.admitted_s
                if s.first_token_s is None:
                    s.first_token_s = now
                s.token_s.append(now)
            touched += [adm.seq, *adm.forks]
        run.now = now
        if self.progress and decodes:
            self.progress(len(decodes))
        return touched, len(ids)

    def _record(self, run: _RunState, kind: str, touched: list[Sequence], computed: int, preemptions: int,
                ts: float, decodes: list[Sequence]) -> None:
        """The step's finishes, KV peaks (before finished sequences are released) and timeline record:
        when it started and how long it took on the wall clock, and the KV tokens its decodes' attention
        read, as a simulated step records them (so a step's price can be set beside its wall time)."""
        sched, cache = self.scheduler, self.cache
        for s in touched:
            if s.finished:
                s.finish_s = run.now
        alloc = cache.allocator
        usage = alloc.usage()
        run.peaks.update(usage)
        start = ts - run.t0
        read = alloc.decode_read_tokens([alloc.num_tokens(s.seq_id) for s in decodes]) if decodes else None
        run.steps.append(StepRecord(kind, 1, len(touched), computed, len(sched.running), len(sched.waiting),
                                    usage.used_tokens * cache.bytes_per_token,
                                    usage.reserved_tokens * cache.bytes_per_token, preemptions, t_s=run.now,
                                    start_s=start, duration_s=run.now - start, kv_tokens_read=read))

    def _result(self, run: _RunState, wall: float) -> EngineResult:
        sched, cache = self.scheduler, self.cache
        return EngineResult(
            sequences=sorted(sched.finished, key=lambda s: (s.request_id, s.sample)),
            rejected=sched.rejected,
            elapsed_s=wall,
            prefill_tokens=run.prefill_tokens,
            decode_steps=len(run.step_s),
            prefill_steps=len(run.prefill_step_s),
            step_s=run.step_s,
            host_s=run.host_s,
            peak_running=sched.peak_running,
            max_concurrency=sched.max_concurrency,
            preemptions=sched.num_preemptions,
            peaks=run.peaks,
            records=run.steps,
            idle_s=run.idle_s,
            memory_bound_steps=run.memory_bound_steps,
            cache_hit_tokens=cache.allocator.cache_hit_tokens,
            counters=getattr(cache.allocator, "host_counters", dict)(),  # the pool's, as the simulator's
            cache_counters=cache.counters(),
            piecewise_steps=self.piecewise_steps,
            prefill_step_s=run.prefill_step_s,
        )
