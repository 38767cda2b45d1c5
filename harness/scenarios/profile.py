"""scenario=profile: the model's own step times on this device, as a table the simulated clock can read.

The roofline assumes its constants; a profile measures them, with the real model code, each
impl's own cache and kernel, and the decode engine's own host work, the way a wall-clock run
pays for them. For every ``(batch, context)`` of the grid it serves ``batch`` requests of
``context``-token prompts for ``decode_steps`` tokens each (one burst, nothing preempted) and
times each step as the engine's clock sees it: from the end of the step before to the end of
its own. A decode point is the median of its steps, at the mean context they read; a prefill
point times single forwards of ``tokens`` prompt tokens (the default grid doubles, and adds both
sides of each row count where the model's GEMMs change kernel), in prompts of the job's workload's mean
prompt length (a forward's attention grows with each prompt's length, not only with the tokens:
one 512-token prompt costs more than eight of 64, so the workload's own shape is the one to price). The points go into the run folder's
``profile`` table (harness/serving/profile_table.py); ``clock_profile=RUN_DIR`` prices a
simulated run from them (harness/serving/profiled_clock.py). The grid is measured ``passes`` times
over and each point pools its samples from every pass (GridSampler says why).

Then, to validate the clock where it can be checked, the job simulates its own workload on the
profile at each of ``rates`` (the rows a wall-clock run of the same config at that
``arrival.rate`` is compared with), and with ``max_rate=true`` searches the largest rate within
the SLO on the profiled clock, as ``scenario=max_rate`` does on the wall clock. With ``wall=true``
it also serves each rate on the wall clock and searches the max rate there, in its own process
(harness/scenarios/wall_check.py: a profile and wall runs from two processes compare two states of
the machine), with the profile's passes after the first spread over those wall runs, and records how far
the machine moved from the first pass to the last (``profile_drift``; a one-pass profile re-times part
of its grid at the end instead).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, List, Sequence

from harness.config import ImplConfig, ScenarioConfig
from harness.errors import ConfigError
from harness.results import run_id

if TYPE_CHECKING:  # reading a config imports this module; running it loads torch
    from harness.scenarios.context import JobContext
    from harness.serving.profiled_clock import ProfilePoints

MIN_CONTEXT = 16


@dataclass
class ProfileScenario(ScenarioConfig):
    """Measured step times for the simulated clock (harness/scenarios/profile.py)."""

    name: str = "profile"
    batches: List[int] = field(default_factory=list)  # empty: powers of two up to ``batch``, and ``batch``
    contexts: List[int] = field(default_factory=list)  # empty: 16 .. max_seq_len - decode_steps - 1, five points
    prefill_tokens: List[int] = field(default_factory=list)  # empty: 16 .. min(max_num_batched_tokens, 4096), x2
    decode_steps: int = 8  # decode steps timed per (batch, context)
    # prefill forwards timed per token count (each its own served burst: one prefill forward apiece); the
    # point is their median, as a decode point is its steps'
    prefill_samples: int = 3
    warmup: int = 1  # untimed passes over the smallest point first (kernels compiled, caches warm)
    # The grid measured this many times over, in turn, each point the median of its samples from all passes
    # (measure_profile says why)
    passes: int = 3
    rates: List[float] = field(default_factory=list)  # arrival.rate values to simulate on the profile
    # arrival.rate values also simulated with chunked_prefill=true and max_num_batched_tokens=chunked_budget
    # (mixed steps priced from the same profile), beside wall-clock runs of those settings
    chunked_rates: List[float] = field(default_factory=list)
    chunked_budget: int = 128
    max_rate: bool = False  # also search the largest rate within the SLO on the profiled clock
    # Also serve the workload on the wall clock at every rate above (and search the max rate on it), in
    # this job's process right after the profile: the rows the validation compares the simulated ones with
    # (harness/scenarios/wall_check.py says why one process); then re-time part of the profile (drift).
    wall: bool = False
    start_rps: float = 1.0  # as scenario=max_rate's
    tolerance_rps: float = 0.25
    search_limit: float = 256


SCHEMA = ProfileScenario


def grid_batches(sc: ProfileScenario, batch: int) -> list[int]:
    if sc.batches:
        return sorted(set(sc.batches))
    out, b = [], 1
    while b < batch:
        out.append(b)
        b *= 2
    return out + [batch]


def grid_contexts(sc: ProfileScenario, max_seq_len: int) -> list[int]:
    """Five contexts, geometric from 16 to the longest prompt the decode steps still fit after."""
    if sc.contexts:
        return sorted(set(sc.contexts))
    top = max_seq_len - sc.decode_steps - 1
    if top <= MIN_CONTEXT:
        return [max(1, top)]
    ratio = (top / MIN_CONTEXT) ** 0.25
    return sorted({round(MIN_CONTEXT * ratio ** i) for i in range(4)} | {top})


def grid_prefill(sc: ProfileScenario, max_num_batched_tokens: int) -> list[int]:
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


def check(ctx: JobContext) -> None:
    cfg, sc = ctx.cfg, ctx.cfg.scenario
    if sc.prefill_samples < 1:
        raise ConfigError(f"scenario.prefill_samples={sc.prefill_samples} must be >= 1")
    if sc.passes < 1:
        raise ConfigError(f"scenario.passes={sc.passes} must be >= 1")
    if sc.decode_steps < 2:
        raise ConfigError(f"scenario.decode_steps={sc.decode_steps} must be >= 2 (the first step's time is "
                          "the prefill's tail)")
    for b in grid_batches(sc, cfg.batch):
        if not 1 <= b <= cfg.batch:
            raise ConfigError(f"scenario.batches holds {b}: each must be in [1, batch={cfg.batch}]")
    for c in grid_contexts(sc, cfg.max_seq_len):
        if not 1 <= c or c + sc.decode_steps + 1 > cfg.max_seq_len:
            raise ConfigError(f"scenario.contexts holds {c}: each must be >= 1 and leave room for "
                              f"scenario.decode_steps={sc.decode_steps} in max_seq_len={cfg.max_seq_len}")
    for t in grid_prefill(sc, cfg.max_num_batched_tokens):
        if not 1 <= t <= cfg.max_num_batched_tokens:
            raise ConfigError(f"scenario.prefill_tokens holds {t}: each must be in "
                              f"[1, max_num_batched_tokens={cfg.max_num_batched_tokens}]")
    for key in ("rates", "chunked_rates"):
        if any(not r > 0 for r in getattr(sc, key)):
            raise ConfigError(f"scenario.{key}={list(getattr(sc, key))}: each rate must be > 0 req/s")
    if sc.chunked_rates and sc.chunked_budget < cfg.batch:
        raise ConfigError(f"scenario.chunked_budget={sc.chunked_budget} must be >= batch={cfg.batch} (a chunked "
                          "step's budget holds one decode token per running sequence)")
    if (sc.rates or sc.chunked_rates or sc.max_rate) and cfg.arrival.name == "burst":
        raise ConfigError("scenario.rates and scenario.max_rate simulate arrivals at a rate: set arrival=poisson "
                          "(or gamma, constant)")


def _prompts(ctx: JobContext, count: int, length: int, salt: int) -> list[tuple[int, ...]]:
    import numpy as np

    rng = np.random.default_rng([ctx.cfg.seed, length, count, salt])
    return [tuple(int(t) for t in rng.integers(0, ctx.cfg.model.vocab_size, length)) for _ in range(count)]


def _serve(ctx: JobContext, impl: ImplConfig, prompts: list[tuple[int, ...]], output_len: int, batch: int):
    """The engine's records of serving ``prompts`` at once, each for ``output_len`` tokens: (kind, tokens,
    seconds, attention seconds) per step, timed from the end of the step before (the first from the run's
    start); the last is the part of the step the cache spent attending (harness/measure/attention_timer.py)."""
    import math

    from harness.kv.factory import build_cache
    from harness.measure.attention_timer import AttentionTimer
    from harness.serving.engine import Engine
    from harness.serving.workload import Request

    cfg = copy.deepcopy(ctx.cfg)
    cfg.batch = batch
    longest = max(len(p) for p in prompts) + output_len
    slots = len(prompts) * (math.ceil(max(cfg.max_seq_len, longest) / cfg.block_size) + 1) * cfg.block_size
    cache = build_cache(impl, cfg, int(slots * ctx.bytes_per_token * 1.1), ctx.device)  # nothing is preempted
    engine = Engine(ctx.model, cache, batch, cfg.max_num_batched_tokens, sync=ctx.sync)
    timer = AttentionTimer(ctx.device)
    timer.wrap(cache)  # after the engine's warm-up of the cache: only the steps' own calls are timed
    result = engine.run([Request(i, p, output_len, 1) for i, p in enumerate(prompts)])
    if result.preemptions or result.rejected:
        raise RuntimeError(f"profile point of {len(prompts)} prompts of {len(prompts[0])} tokens was preempted "
                           "or rejected: the profile's own cache was sized too small")
    attention = timer.per_forward()  # one forward per recorded step: nothing was preempted
    if len(attention) != len(result.steps):
        raise RuntimeError(f"profile point: {len(attention)} timed forwards for {len(result.steps)} steps")
    out, before = [], 0.0
    for rec, attn in zip(result.steps, attention):
        out.append((rec.kind, rec.tokens, rec.t_s - before, attn))
        before = rec.t_s
    return out


Key = tuple  # ("decode", batch, context) or ("prefill", tokens, 0)


class GridSampler:
    """A profile's grid points and their samples, measured pass by pass.

    Each pass serves every point once (every other pass in reverse order); a point's row pools its samples
    from the passes asked for (their median). On a shared machine a slow spell of a few seconds then lands
    a little on many points, not wholly on the few measured during it: one pass left neighbouring points
    10-20% apart the wrong way round (a larger batch cheaper), and its first points, measured while
    freshly allocated memory was first touched, 10-30% slow. A validating job spreads its passes over its
    wall runs (``run``), so that the profile samples the machine over the minutes they do."""

    def __init__(self, ctx: JobContext, impl: ImplConfig, grid: tuple[list[int], list[int], list[int]]) -> None:
        batches, contexts, prefill = grid
        self.ctx, self.impl = ctx, impl
        self.keys: list[Key] = [("decode", b, c) for b in batches for c in contexts] + [("prefill", t, 0) for t in prefill]
        self.passes: list[dict[Key, tuple[list[float], list[float]]]] = []
        self._prompt_len = prefill_prompt_len(ctx)

    def warm_up(self, times: int) -> None:
        """Untimed serving of the smallest decode point (kernels compiled, caches warm)."""
        _, batch, context = self.keys[0]
        for _ in range(times):
            _serve(self.ctx, self.impl, _prompts(self.ctx, batch, context, 999_999), 3, batch)

    def measure_pass(self) -> None:
        ctx, impl, sc, n = self.ctx, self.impl, self.ctx.cfg.scenario, len(self.passes)
        repeats = max(1, ctx.cfg.repeat)
        got: dict[Key, tuple[list[float], list[float]]] = {}
        for key in self.keys if n % 2 == 0 else reversed(self.keys):
            seconds, attention = got[key] = ([], [])
            if key[0] == "decode":
                for rep in range(repeats):
                    steps = _serve(ctx, impl, _prompts(ctx, key[1], key[2], n * repeats + rep), sc.decode_steps + 1,
                                   key[1])
                    seconds += [s for kind, _, s, _ in steps if kind == "decode"]
                    attention += [a for kind, _, _, a in steps if kind == "decode"]
            else:
                for rep in range(repeats * sc.prefill_samples):
                    salt = 1000 * (n * repeats * sc.prefill_samples + rep)
                    for s, a in _prefill_forward(ctx, impl, key[1], self._prompt_len, salt):
                        seconds.append(s)
                        attention.append(a)
        self.passes.append(got)

    def rows(self, passes: slice = slice(None)) -> list[dict]:
        """The profile table's rows from the samples of ``passes`` (all of them by default)."""
        from harness.serving.profile_table import point

        decode_steps = self.ctx.cfg.scenario.decode_steps
        rows = []
        for key in self.keys:
            seconds = [s for got in self.passes[passes] for s in got[key][0]]
            attention = [a for got in self.passes[passes] for a in got[key][1]]
            if key[0] == "decode":
                _, batch, context = key
                # the prefill left each sequence context + 1 tokens, and decode step j reads context + 1 + j of
                # them per sequence, as the simulator counts a step's KV tokens read
                mean_context = context + 1 + (decode_steps - 1) / 2
                rows.append(point(self.impl.name, "decode", seconds, batch=batch, context=mean_context,
                                  attention=attention))
            elif seconds:
                rows.append(point(self.impl.name, "prefill", seconds, tokens=key[1], attention=attention))
        return rows


def measure_profile(ctx: JobContext, impl: ImplConfig,
                    grid: tuple[list[int], list[int], list[int]] | None = None, passes: int | None = None) -> list[dict]:
    """The profile table's rows for ``impl``: decode points over batches x contexts, then prefill points, each
    the median of ``passes`` passes' samples (``scenario.passes``; GridSampler says why); ``grid``: (batches,
    contexts, prefill token counts) instead of the scenario's (no warm-up then)."""
    sampler = GridSampler(ctx, impl, grid or profile_grid(ctx.cfg, ctx.model.gemm_row_breaks()))
    sampler.warm_up(0 if grid else ctx.cfg.scenario.warmup)
    for _ in range(max(1, ctx.cfg.scenario.passes if passes is None else passes)):
        sampler.measure_pass()
    return sampler.rows()


def interleaved(tasks: list[Callable[[], None]], passes: int, measure_pass: Callable[[], None]) -> None:
    """Run ``tasks`` in order with ``passes`` calls of ``measure_pass`` spread evenly among them, the last one
    after the last task (none: the tasks alone)."""
    done = 0
    for k in range(1, passes + 1):
        upto = round(k * len(tasks) / passes)
        for task in tasks[done:upto]:
            task()
        done = upto
        measure_pass()
    for task in tasks[done:]:
        task()


def _prefill_forward(ctx: JobContext, impl: ImplConfig, tokens: int, prompt_len: int, salt: int) -> list[tuple]:
    """(seconds, attention seconds) of one prefill forward of ``tokens`` prompt tokens, in prompts of
    ``prompt_len`` (the last one shorter); empty if the engine split them over several forwards."""
    sizes = [prompt_len] * (tokens // prompt_len) + ([tokens % prompt_len] if tokens % prompt_len else [])
    prompts = [p for i, size in enumerate(sizes) for p in _prompts(ctx, 1, size, salt + i)]
    return [(s, a) for kind, computed, s, a in _serve(ctx, impl, prompts, 1, len(prompts))
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


def prefill_prompt_len(ctx: JobContext) -> int:
    """The prompt length prefill points are made of: the workload's mean, within the context (room
    for the one token a prefill generates)."""
    import statistics

    top = ctx.cfg.max_seq_len - 2
    requests = ctx.requests
    if not requests:
        return top
    return max(1, min(top, round(statistics.mean(len(r.prompt_ids) for r in requests))))


def attention_shares(rows: list[dict]) -> dict:
    """The row's view of the profile's attention columns: the median share of a step spent in the cache's
    attention over the decode points and over the prefill points, and the share at the decode point of the
    largest batch and context (where attention weighs most)."""
    import statistics

    out: dict = {}
    for kind in ("decode", "prefill"):
        shares = [r["attention_share"] for r in rows if r["kind"] == kind and r.get("attention_share") is not None]
        out[f"attention_share_{kind}"] = statistics.median(shares) if shares else None
    decode = [r for r in rows if r["kind"] == "decode" and r.get("attention_share") is not None]
    top = max(decode, key=lambda r: (r["batch"], r["context"]), default=None)
    out["attention_share_decode_top"] = top["attention_share"] if top else None
    return out


def points_of(rows: list[dict]) -> ProfilePoints:
    from harness.serving.profiled_clock import ProfilePoints

    return ProfilePoints(tuple((r["batch"], r["context"], r["seconds"]) for r in rows if r["kind"] == "decode"),
                         tuple((r["tokens"], r["seconds"]) for r in rows if r["kind"] == "prefill"))


def _simulated(ctx: JobContext, impl: ImplConfig, points: ProfilePoints, rate: float,
               chunked_budget: int | None = None) -> dict:
    """The job's workload at ``rate`` on the profiled clock, as a capacity run prices it; with
    ``chunked_budget``, scheduled with chunked prefill under that many tokens a step."""
    from harness.scenarios.capacity import simulated_row
    from harness.scenarios.wall_check import at_rate, probe_identifiers
    from harness.serving.profiled_clock import ProfiledClock

    probe = at_rate(ctx, rate, chunked_budget)
    clock = ProfiledClock(points)
    return {**simulated_row(probe, impl, clock=clock, source=clock.id), **probe_identifiers(probe, impl)}


def recheck_grid(ctx: JobContext) -> tuple[list[int], list[int], list[int]]:
    """The part of a one-pass profile re-timed at a validating job's end: every context at the middle batch
    of the grid, and the second smallest prefill point (a few seconds at tiny scale)."""
    batches, contexts, prefill = profile_grid(ctx.cfg, ctx.model.gemm_row_breaks())
    return [batches[len(batches) // 2]], contexts, prefill[1:2] or prefill


def _probed(ctx: JobContext, measure: Callable[[], None], seen: list) -> Callable[[], None]:
    """``measure`` with the CPU it got recorded in ``seen`` (harness/measure/contention.py), on a CPU."""
    from harness.measure.contention import probe_for

    def run() -> None:
        probe = probe_for(ctx.device.type)
        if probe is None:
            return measure()
        with probe:
            measure()
        seen.append(probe.result())

    return run


def run(ctx: JobContext, impl: ImplConfig) -> list[dict]:
    from harness.measure.contention import with_contention
    import pandas as pd

    from harness.scenarios.max_rate import probe_record, search_rate
    from harness.scenarios.wall_check import drift, priced, wall_max_rate, wall_row
    from harness.serving.profile_table import profile_frame
    from harness.serving.profiled_clock import ProfiledClock, profile_id
    from harness.serving.service_metrics import slo_label
    from harness.serving.timeline import append_table

    check(ctx)
    sc = ctx.cfg.scenario
    sampler = GridSampler(ctx, impl, profile_grid(ctx.cfg, ctx.model.gemm_row_breaks()))
    sampler.warm_up(sc.warmup)
    # With wall=true, each rate served on the wall clock (the first with the warm-up), then the max rate
    # searched there: tasks between which the profile's later passes are spread, so that the profile samples
    # the machine over the minutes the wall runs do (on the 2-core CPU machines its speed moved 5-15% within a
    # job's two minutes, with no other process in sight). Their steps are priced once the profile is whole.
    runs = [(rate, None) for rate in sc.rates] + [(rate, sc.chunked_budget) for rate in sc.chunked_rates]
    walls: dict[tuple, dict] = {}
    served: dict[float, dict] = {}  # whole-prompt wall rows, whose SLO verdicts the wall search reuses
    steps: list[pd.DataFrame] = []
    listed: list[dict] = []  # both searches' probes: the job's rate_probes table
    tasks: list[Callable[[], None]] = []
    if sc.wall:
        for i, (rate, budget) in enumerate(runs):
            def serve(rate: float = rate, budget: int | None = budget, warmup: int = int(i == 0)) -> None:
                row, frame = wall_row(ctx, impl, rate, budget, warmup)
                walls[(rate, budget)] = row
                if frame is not None:
                    steps.append(frame)
                if budget is None and row.get("status") == "ok" and row.get("slo_pass") is not None:
                    served[float(rate)] = row
            tasks.append(serve)
        if sc.max_rate:
            tasks.append(lambda: walls.setdefault("max_rate", wall_max_rate(ctx, impl, served, listed)))
    seen: list = []  # the CPU each pass got
    measure_pass = _probed(ctx, sampler.measure_pass, seen)
    measure_pass()
    interleaved(tasks, sc.passes - 1, measure_pass)
    rows = sampler.rows()
    append_table(ctx.tables, "profile", profile_frame(rows))
    points = points_of(rows)
    pid = profile_id(points)
    spread = (f"; measured in {sc.passes} passes spread over the wall runs" if sc.wall and sc.passes > 1 and tasks
              else "")
    summary = {"status": "ok", "clock_source": pid, "probes": len(rows), **attention_shares(rows),
               "notes": f"{len(points.decode)} decode and {len(points.prefill)} prefill points{spread}; "
                        f"clock_profile={run_id(ctx.run_dir)} prices a simulated run from them"}
    if seen:  # the pass whose CPU was the most contended speaks for the profile
        summary = with_contention(summary, max(seen, key=lambda c: (c.contended, c.others_cpu or 0.0)))
    out = [summary]
    for frame in steps:
        append_table(ctx.tables, "steps", priced(frame, ProfiledClock(points)))
    for rate, budget in runs:
        if (rate, budget) in walls:
            out.append(walls[(rate, budget)])
        out.append(_simulated(ctx, impl, points, rate, budget))
    if sc.max_rate:
        if "max_rate" in walls:
            out.append(walls["max_rate"])

        def passes(rate: float) -> bool:
            row = _simulated(ctx, impl, points, rate)
            listed.append(probe_record(impl.name, run_id(ctx.run_dir), rate, row, "simulated"))
            return bool(row.get("slo_pass"))

        found, probes = search_rate(passes, sc.start_rps, sc.search_limit, sc.tolerance_rps)
        append_table(ctx.tables, "rate_probes", pd.DataFrame(listed))
        out.append({"status": "ok", "clock": "simulated", "clock_source": pid, "arrival": ctx.cfg.arrival.name,
                    "slo": slo_label(ctx.cfg.slo), "max_rate_rps": found, "probes": probes,
                    "notes": f"max rate within the SLO on the profiled clock; {probes} probes"})
    if sc.wall:  # how far the machine moved while the wall runs ran: the last pass against the first
        last = sampler.rows(slice(-1, None)) if len(sampler.passes) > 1 else \
            measure_profile(ctx, impl, recheck_grid(ctx), passes=1)
        summary["profile_drift"] = drift(sampler.rows(slice(0, 1)), last)
    return out
