"""A profile's grid and its measurement: which points ``scenario=profile`` times, and how (harness/scenarios/profile.py).

The grids: batches (powers of two up to ``batch``), contexts (five, geometric from 16) and prefill token
counts (doubling from 16), each default one with both sides of every row count where the model's dense
GEMMs change kernel. The measurement: the decode engine serves each point as a burst and times its steps
as its own clock sees them (``_serve``); ``GridSampler`` measures the grid pass by pass and pools each
point's samples. Nothing here is a scenario (harness/scenarios/__init__.py ``NOT_SCENARIOS``).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from kvbench.harness.config import ImplConfig
from kvbench.harness.scenarios import after_idle_probe
from kvbench.harness.scenarios.after_idle_probe import Sample

from kvbench.harness.measure.pace_meter import Unit

if TYPE_CHECKING:  # reading a config imports this module; running it loads torch
    from kvbench.harness.scenarios.compute import Compute
    from kvbench.harness.scenarios.job_run import JobRun
    from kvbench.harness.scenarios.job_workload import JobWorkload

MIN_CONTEXT = 16


class GridKeys(Protocol):
    """The keys of scenario=profile's schema (harness/scenarios/profile.py ``ProfileScenario``) that set its grid:
    named by their shape, so this module does not import the scenario that imports it."""

    batches: Sequence[int]
    contexts: Sequence[int]
    prefill_tokens: Sequence[int]
    decode_steps: int
    settle_steps: int


def grid_batches(sc: GridKeys, batch: int) -> list[int]:
    if sc.batches:
        return sorted(set(sc.batches))
    out, b = [], 1
    while b < batch:
        out.append(b)
        b *= 2
    return out + [batch]


def grid_contexts(sc: GridKeys, max_seq_len: int) -> list[int]:
    """Five contexts, geometric from 16 to the longest prompt the settling and timed decode steps still fit after."""
    if sc.contexts:
        return sorted(set(sc.contexts))
    top = max_seq_len - sc.settle_steps - sc.decode_steps - 1
    if top <= MIN_CONTEXT:
        return [max(1, top)]
    ratio = (top / MIN_CONTEXT) ** 0.25
    return sorted({round(MIN_CONTEXT * ratio ** i) for i in range(4)} | {top})


def grid_prefill(sc: GridKeys, max_num_batched_tokens: int) -> list[int]:
    """Doubling from 16 to min(max_num_batched_tokens, 4096). Doubling, not x4: a prefill's cost bends
    where its attention starts to weigh and where its GEMMs change kernel, and a line over a x4 span
    priced the 2-core CPU's 65-128-token prefills 13-15% under their wall time."""
    if sc.prefill_tokens:
        return sorted(set(sc.prefill_tokens))
    top, out, t = min(max_num_batched_tokens, 4096), [], MIN_CONTEXT
    while t < top:
        out.append(t)
        t *= 2
    return out + [top]


def _prompts(job: JobRun, count: int, length: int, salt: int) -> list[tuple[int, ...]]:
    import numpy as np

    rng = np.random.default_rng([job.cfg.seed, length, count, salt])
    return [tuple(int(t) for t in rng.integers(0, job.cfg.model.vocab_size, length)) for _ in range(count)]


def _serve(job: JobRun, compute: Compute, impl: ImplConfig, prompts: list[tuple[int, ...]], output_len: int,
           batch: int):
    """The engine's records of serving ``prompts`` at once, each for ``output_len`` tokens: (kind, tokens,
    seconds, attention seconds) per step, timed from the end of the step before (the first from the run's
    start); the last is the part of the step the cache spent attending (harness/measure/attention_timer.py)."""
    import math

    from kvbench.harness.kv.factory import build_cache
    from kvbench.harness.measure.attention_timer import AttentionTimer
    from kvbench.harness.serving.engine import Engine
    from kvbench.harness.serving.workload import Request

    cfg = copy.deepcopy(job.cfg)
    cfg.batch = batch
    longest = max(len(p) for p in prompts) + output_len
    slots = len(prompts) * (math.ceil(max(cfg.max_seq_len, longest) / cfg.block_size) + 1) * cfg.block_size
    cache = build_cache(impl, cfg, int(slots * job.bytes_per_token * 1.1), job.device)  # nothing is preempted
    engine = Engine(compute.model, cache, batch, cfg.max_num_batched_tokens, sync=compute.sync)
    timer = AttentionTimer(job.device)
    timer.wrap(cache)  # after the engine's warm-up of the cache: only the steps' own calls are timed
    result = engine.run([Request(i, p, output_len, 1) for i, p in enumerate(prompts)])
    if result.preemptions or result.rejected:
        raise RuntimeError(f"profile point of {len(prompts)} prompts of {len(prompts[0])} tokens was preempted "
                           "or rejected: the profile's own cache was sized too small")
    attention = timer.per_forward()  # one forward per recorded step: nothing was preempted
    if len(attention) != len(result.records):
        raise RuntimeError(f"profile point: {len(attention)} timed forwards for {len(result.records)} steps")
    out, before = [], 0.0
    for rec, attn in zip(result.records, attention):
        out.append((rec.kind, rec.tokens, rec.t_s - before, attn))
        before = rec.t_s
    return out


def prefill_reach(prefill: Sequence[int], most: int) -> list[int]:
    """The prefill points a run whose prefill steps compute at most ``most`` prompt tokens prices on: every point
    below ``most`` and the first at or above it, so that every such step is interpolated between measured points,
    never extrapolated (``reach``'s rule for the decode grid). On the CPU clock's 2,048-token budget the
    4,096-token point goes: half of a pass's timed prefill (three forwards of 0.40-0.42 s), for a step no run of
    that budget takes (its wall runs' largest prefill: 260-452 tokens). A step past it (another budget's run) is
    counted outside."""
    kept = [t for t in prefill if t < most]
    return kept + [t for t in prefill if t >= most][:1]


Key = tuple  # ("decode", batch, context) or ("prefill", tokens, 0)
Fits = Callable[[int, int], bool]  # (sequences, context) -> whether the run's KV budget holds them at once


def reach(batches: Sequence[int], contexts: Sequence[int], fits: Fits) -> list[tuple[int, int]]:
    """The decode points a run of a KV budget can price on (``fits``): each batch's line up to the first context
    at which the fewest sequences priced on it (one more than the batch below; 1 on the first line) no longer
    fit, that one included, so that every step the budget holds is interpolated between measured points, never
    extrapolated; a line on which no such step lies is left out. On the CPU clock's 2,048-token budget the
    contiguous cache holds 4 sequences (lines 8 to 32 left out) and a paged one no 17 sequences of 216 tokens
    ((32, 495) left out): the points that cost a profile pass most (their prompts are prefilled to set them up),
    none of which a run of that budget could reach. A step past them (another budget's run) is counted outside."""
    points: list[tuple[int, int]] = []
    for i, b in enumerate(batches):
        fewest = batches[i - 1] + 1 if i else 1
        if i and not fits(fewest, contexts[0]):
            break  # no larger line either: their fewest are more
        for c in contexts:
            points.append((b, c))
            if not fits(fewest, c):
                break
    return points


class GridSampler:
    """A profile's grid points and their samples, measured pass by pass (each pass ending with the after-idle
    probe: harness/scenarios/after_idle_probe.py).

    Each pass serves every point once (every other pass in reverse order); a point's row pools its samples
    from the passes asked for (their median). On a shared machine a slow spell of a few seconds then lands
    a little on many points, not wholly on the few measured during it: one pass left neighbouring points
    10-20% apart the wrong way round (a larger batch cheaper), and its first points, measured while
    freshly allocated memory was first touched, 10-30% slow. A validating job spreads its passes over its
    wall runs (``run``), so that the profile samples the machine over the minutes they do."""

    def __init__(self, job: JobRun, workload: JobWorkload, compute: Compute, impl: ImplConfig,
                 grid: tuple[list[int], list[int], list[int]], fits: Fits | None = None) -> None:
        batches, contexts, prefill = grid
        self.job, self.compute, self.impl = job, compute, impl
        decode = reach(batches, contexts, fits) if fits is not None else [(b, c) for b in batches for c in contexts]
        self.keys: list[Key] = [("decode", b, c) for b, c in decode] + [("prefill", t, 0) for t in prefill]
        self.passes: list[dict[Key, tuple[list[float], list[float]]]] = []
        self.idle: list[list[Sample]] = []  # each pass's after-idle probe (harness/scenarios/after_idle_probe.py)
        # the pace meter's units timed between this profile's points (compute.pace: a validating job's)
        self.pace_s: list[Unit] = []
        self._prompt_len = prefill_prompt_len(job, workload)

    def warm_up(self, times: int) -> None:
        """Untimed serving of the smallest decode point (kernels compiled, caches warm)."""
        _, batch, context = self.keys[0]
        for _ in range(times):
            _serve(self.job, self.compute, self.impl, _prompts(self.job, batch, context, 999_999), 3, batch)

    def measure_pass(self) -> None:
        job, compute, impl, n = self.job, self.compute, self.impl, len(self.passes)
        sc = job.cfg.scenario
        repeats = max(1, job.cfg.repeat)
        got: dict[Key, tuple[list[float], list[float]]] = {}
        for key in self.keys if n % 2 == 0 else reversed(self.keys):
            seconds, attention = got[key] = ([], [])
            if key[0] == "decode":
                for rep in range(repeats):
                    steps = _serve(job, compute, impl, _prompts(job, key[1], key[2], n * repeats + rep),
                                   sc.settle_steps + sc.decode_steps + 1, key[1])
                    timed = [(s, a) for kind, _, s, a in steps if kind == "decode"][sc.settle_steps:]  # settled
                    seconds += [s for s, _ in timed]
                    attention += [a for _, a in timed]
            else:
                for rep in range(repeats * sc.prefill_samples):
                    salt = 1000 * (n * repeats * sc.prefill_samples + rep)
                    for s, a in _prefill_forward(job, compute, impl, key[1], self._prompt_len, salt):
                        seconds.append(s)
                        attention.append(a)
            if compute.pace is not None:  # the machine's pace while the profile is measured, point by point
                batch = key[1] if key[0] == "decode" else 0  # the unit reads the state the point left
                self.pace_s.append(Unit(compute.pace.tick(batch=batch), batch))
        self.passes.append(got)
        self.idle.append(after_idle_probe.probe(job, compute, impl, self._prompt_len, salt=n))

    def rows(self, passes: slice = slice(None)) -> list[dict]:
        """The profile table's rows from the samples of ``passes`` (all of them by default)."""
        from kvbench.harness.serving.profile_table import point

        sc = self.job.cfg.scenario
        rows = []
        for key in self.keys:
            seconds = [s for got in self.passes[passes] for s in got[key][0]]
            attention = [a for got in self.passes[passes] for a in got[key][1]]
            if key[0] == "decode":
                _, batch, context = key
                # the prefill left each sequence context + 1 tokens, and decode step j reads context + 1 + j of
                # them per sequence, as the simulator counts a step's KV tokens read; the timed steps are those
                # from j = settle_steps on
                mean_context = context + 1 + sc.settle_steps + (sc.decode_steps - 1) / 2
                rows.append(point(self.impl.name, "decode", seconds, batch=batch, context=mean_context,
                                  attention=attention))
            elif seconds:
                rows.append(point(self.impl.name, "prefill", seconds, tokens=key[1], attention=attention))
        return rows


def _prefill_forward(job: JobRun, compute: Compute, impl: ImplConfig, tokens: int, prompt_len: int,
                     salt: int) -> list[tuple]:
    """(seconds, attention seconds) of one prefill forward of ``tokens`` prompt tokens, in prompts of
    ``prompt_len`` (the last one shorter); empty if the engine split them over several forwards."""
    sizes = [prompt_len] * (tokens // prompt_len) + ([tokens % prompt_len] if tokens % prompt_len else [])
    prompts = [p for i, size in enumerate(sizes) for p in _prompts(job, 1, size, salt + i)]
    return [(s, a) for kind, computed, s, a in _serve(job, compute, impl, prompts, 1, len(prompts))
            if kind == "prefill" and computed == tokens]


def profile_grid(cfg, breaks: Sequence[int] = ()) -> tuple[list[int], list[int], list[int]]:
    """(batches, contexts, prefill token counts) of a profile of ``cfg``: the scenario's grids, each default
    one with ``breaks`` added within its range: the row counts on either side of which the model's dense
    GEMMs change kernel (``LlamaModel.gemm_row_breaks``), so that no interpolated segment spans a jump in
    the step's cost. A grid the scenario names is measured as named."""
    sc = cfg.scenario
    batches = grid_batches(sc, cfg.batch)
    prefill = grid_prefill(sc, cfg.max_num_batched_tokens)
    if not sc.batches:
        batches = sorted(set(batches) | {b for b in breaks if 1 <= b <= cfg.batch})
    if not sc.prefill_tokens:
        prefill = sorted(set(prefill) | {t for t in breaks if prefill[0] <= t <= prefill[-1]})
    return batches, grid_contexts(sc, cfg.max_seq_len), prefill


def prefill_prompt_len(job: JobRun, workload: JobWorkload) -> int:
    """The prompt length prefill points are made of: the workload's mean, within the context (room
    for the one token a prefill generates)."""
    import statistics

    top = job.cfg.max_seq_len - 2
    requests = workload.requests
    if not requests:
        return top
    return max(1, min(top, round(statistics.mean(len(r.prompt_ids) for r in requests))))
