"""The decode engine: continuous batching of real model forwards over one KV cache.

Knows nothing about which impl it runs: it asks the scheduler for a step, applies
the copies the allocator asked for, and runs one model forward per step: a varlen
prefill of every prompt admitted in the step (their new tokens concatenated, logits
only at each prompt's last token) or a batched decode of all running sequences. Each
layer attends through the cache's ``forward_prefill`` or ``forward_decode``, which the
engine picks once per step.
Greedy sampling; sample ``k`` of a request with ``n > 1`` takes the ``k``-th ranked
token first (so parallel samples diverge and copy-on-write is exercised), then
continues greedily.

A forward's integer inputs (token ids, positions, and the cache's metadata) go to
the device in one copy: the engine adds its fields to a ``StagingBuffer`` and the
cache's ``prepare_*`` adds its own and uploads it.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

import torch

from harness.model.llama import LlamaModel
from harness.model.piecewise import PiecewiseDecode
from harness.scheduler import Admission, Scheduler
from harness.sequence import Sequence
from harness.timeline import StepRecord
from harness.workload import Request
from harness.measure.kv_peaks import KVPeaks
from impls.base import KVCache, PrefillSpan
from impls.staging import StagingBuffer


@dataclass
class EngineResult:
    sequences: list[Sequence]  # finished, in (request_id, sample) order
    rejected: list[tuple[Sequence, str]]
    wall_s: float
    prefill_tokens: int  # tokens actually computed in prefills (cache hits excluded)
    decode_steps: int
    step_s: list[float]  # wall time of every decode step
    host_s: list[float]  # host time of every decode step: from its start until the forward is enqueued
    peak_running: int
    max_concurrency: int  # the most sequences running at once before the first preemption
    preemptions: int
    peaks: KVPeaks
    steps: list[StepRecord]
    idle_s: float = 0.0  # time with nothing arrived and nothing running
    memory_bound_steps: int = 0  # decode steps with room in the batch while an arrived request waited for KV
    cache_hit_tokens: int = 0
    counters: dict[str, int] | None = None  # KVCache.counters() at the end of the run
    piecewise_steps: int = 0  # decode steps run as pieces (CUDA graphs on a GPU)


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
    ) -> None:
        self.model = model
        # Decode steps of at most pieces.max_batch sequences run as pieces (CUDA graphs on a GPU)
        # around the cache's attention; larger ones, and every prefill, run the model eagerly.
        self.pieces = pieces
        self.piecewise_steps = 0
        self.cache = cache
        self.max_num_seqs = max_num_seqs
        self.sync = sync  # waits for the device, so step times are real
        self.progress = progress
        self.device = next(model.parameters()).device
        cache.warmup()  # JIT compiles happen here, never inside the timed loop
        self.scheduler = Scheduler(cache.allocator, max_num_seqs, max_num_batched_tokens,
                                   max_seq_tokens=cache.allocator.max_sequence_tokens())

    def _forward(self, staging: StagingBuffer, ids: int, positions: int, attend: Callable[..., torch.Tensor],
                 meta: Any, logits_at: int | None = None):
        """The model over staged ``ids`` and ``positions`` (``staging`` uploaded); every layer attends
        through ``attend`` (the cache's ``forward_prefill`` or ``forward_decode``) with ``meta``."""
        at = staging[logits_at] if logits_at is not None else None
        return self.model(staging[ids], staging[positions], lambda layer, q, k, v: attend(layer, q, k, v, meta), at)

    def _decode_forward(self, staging: StagingBuffer, ids: int, positions: int, meta: Any, batch: int):
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
        for adm, row in zip(admitted, logits):
            forks = adm.forks
            ranked = torch.topk(row, 1 + len(forks)).indices.tolist() if forks else [int(row.argmax())]
            for rank, s in enumerate([adm.seq, *forks]):
                s.output_ids.append(ranked[rank])
        return len(ids)

    @torch.inference_mode()
    def run(self, requests: list[Request]) -> EngineResult:
        """Serve ``requests`` on the wall clock: each is admitted only once it has arrived."""
        sched, cache = self.scheduler, self.cache
        pending = deque(sorted(requests, key=lambda r: r.arrival_s))  # stable: burst keeps request order
        t0 = time.perf_counter()
        clock = lambda: time.perf_counter() - t0  # noqa: E731
        prefill_tokens, idle_s, memory_bound_steps = 0, 0.0, 0
        self.piecewise_steps = 0
        step_s: list[float] = []
        host_s: list[float] = []
        steps: list[StepRecord] = []
        peaks = KVPeaks(cache.bytes_per_token)
        while pending or not sched.done:
            now = clock()
            while pending and pending[0].arrival_s <= now:
                sched.add_request(pending.popleft())
            if sched.done:  # nothing has arrived and nothing runs: wait for the next arrival
                time.sleep(max(0.0, pending[0].arrival_s - now))
                idle_s += clock() - now
                continue
            ts = time.perf_counter()
            preempted_before = sched.num_preemptions
            plan = sched.schedule()
            touched: list[Sequence] = []
            if plan.is_prefill:
                computed = self._prefill(plan.admitted)
                prefill_tokens += computed
                # The forks' slots are copied from their parents, so only once the parents are written.
                cache.copy_slots([c for adm in plan.admitted for c in adm.fork_copies])
                self.sync()
                now = clock()
                for adm in plan.admitted:
                    for s in (adm.seq, *adm.forks):
                        if s.admitted_s is None:
                            s.admitted_s = ts - t0
                        if s.first_token_s is None:
                            s.first_token_s = now
                        s.token_s.append(now)
                    touched += [adm.seq, *adm.forks]
                kind = "prefill"
            elif plan.decodes:
                cache.copy_slots(plan.copies)
                seqs = plan.decodes
                staging = StagingBuffer(self.device)
                ids = staging.add([s.output_ids[-1] for s in seqs])
                positions = staging.add([s.num_tokens - 1 for s in seqs])
                meta = cache.prepare_decode([s.seq_id for s in seqs], staging)
                logits = self._decode_forward(staging, ids, positions, meta, len(seqs))
                host_s.append(time.perf_counter() - ts)  # enqueued; on a GPU nothing has waited for it yet
                for s, tok in zip(seqs, logits.argmax(dim=-1).tolist()):
                    s.output_ids.append(tok)
                touched = seqs
                self.sync()
                step_s.append(time.perf_counter() - ts)
                now = clock()
                for s in seqs:
                    s.token_s.append(now)
                computed = len(seqs)
                kind = "decode"
                if self.progress:
                    self.progress(len(seqs))
                if sched.waiting and len(sched.running) + sched.waiting[0][1] <= self.max_num_seqs:
                    memory_bound_steps += 1  # batch had room, yet nothing was admitted: the KV budget
            else:  # every running sequence was preempted: nothing to compute this step
                sched.finish(touched)
                continue
            for s in touched:
                if s.finished:
                    s.finish_s = now
            usage = cache.allocator.usage()
            peaks.update(usage)  # before finished sequences are released
            steps.append(StepRecord(now, kind, len(touched), computed, len(sched.running), len(sched.waiting),
                                    usage.used_tokens * cache.bytes_per_token,
                                    usage.reserved_tokens * cache.bytes_per_token,
                                    sched.num_preemptions - preempted_before))
            sched.finish(touched)
        self.sync()
        wall = time.perf_counter() - t0
        done = sorted(sched.finished, key=lambda s: (s.request_id, s.sample))
        return EngineResult(
            sequences=done,
            rejected=sched.rejected,
            wall_s=wall,
            prefill_tokens=prefill_tokens,
            decode_steps=len(step_s),
            step_s=step_s,
            host_s=host_s,
            peak_running=sched.peak_running,
            max_concurrency=sched.max_concurrency,
            preemptions=sched.num_preemptions,
            peaks=peaks,
            steps=steps,
            idle_s=idle_s,
            memory_bound_steps=memory_bound_steps,
            cache_hit_tokens=cache.allocator.cache_hit_tokens,
            counters=cache.counters(),
            piecewise_steps=self.piecewise_steps,
        )
