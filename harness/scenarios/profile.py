"""scenario=profile: the model's own step times on this device, as a table the simulated clock can read.

The roofline assumes its constants; a profile measures them, with the real model code, each
impl's own cache and kernel, and the decode engine's own host work, the way a wall-clock run
pays for them. For every ``(batch, context)`` of the grid it serves ``batch`` requests of
``context``-token prompts (one burst, nothing preempted) for ``settle_steps`` decode steps, then
``decode_steps`` more, and times each of those as the engine's clock sees it: from the end of the
step before to the end of its own. A decode point is the median of its timed steps, at the mean
context they read: the burst's steady state (its first steps run slower), the state the after-idle
probe's factors (the steps after a sleep or a prompt's prefill) and the pace meter's units (the
machine's speed in a wall run) are measured against. A prefill
point times single forwards of ``tokens`` prompt tokens (the default grid doubles, and adds both
sides of each row count where the model's GEMMs change kernel), in prompts of the job's workload's mean
prompt length (a forward's attention grows with each prompt's length, not only with the tokens:
one 512-token prompt costs more than eight of 64, so the workload's own shape is the one to price). The points go into the run folder's
``profile`` table (harness/serving/profile_table.py), each row with what measured it (model, dtype,
KV store, kernel, device and commit: ``made_by``); ``clock_profile=RUN_DIR`` prices a simulated run of
those settings from them (harness/serving/profiled_clock.py; another setting's run is refused, clocks.py). The grid is measured ``passes`` times
over and each point pools its samples from every pass (harness/scenarios/profile_grid.py: the grid,
and ``GridSampler``, which says why).

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

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, List

from kvbench.harness.config import ImplConfig, ScenarioConfig
from kvbench.harness.errors import ConfigError
from kvbench.harness.scenarios.profile_grid import (GridSampler, grid_batches, grid_contexts, grid_prefill, prefill_reach,
                                                    profile_grid)

if TYPE_CHECKING:  # reading a config imports this module; running it loads torch
    from kvbench.harness.scenarios.compute import Compute
    from kvbench.harness.scenarios.job_budget import JobBudget
    from kvbench.harness.scenarios.job_run import JobRun
    from kvbench.harness.scenarios.job_workload import JobWorkload
    from kvbench.harness.scenarios.outputs import Outputs
    from kvbench.harness.serving.profile_table import Provenance
    from kvbench.harness.serving.profiled_clock import ProfilePoints


@dataclass
class ProfileScenario(ScenarioConfig):
    """Measured step times for the simulated clock (harness/scenarios/profile.py)."""

    name: str = "profile"
    # empty: powers of two up to ``batch``, and ``batch``; the prefill grid doubling from 16; both with the
    # model's GEMM row breaks within range (harness/scenarios/profile_grid.py profile_grid)
    batches: List[int] = field(default_factory=list)
    # empty: 16 .. max_seq_len - settle_steps - decode_steps - 1, five points
    contexts: List[int] = field(default_factory=list)
    prefill_tokens: List[int] = field(default_factory=list)  # empty: 16 .. min(max_num_batched_tokens, 4096), x2
    decode_steps: int = 8  # decode steps timed per (batch, context)
    # Decode steps each point's burst runs before its timed ones, untimed. The first steps of a fresh burst run
    # slower than its later ones: on the AMD 2-core (tiny-llama, one thread) its steps 9-16 ran at a median
    # 0.85-0.94x its steps 1-8 at batches 1-4 (contiguous, paged_cuda; paged_torch 0.95-0.97x), and 17-24 no
    # faster than 9-16. Timed from the first, a point mixed that warm-up into the steady state the pace meter's
    # units run in: the meter missed a wall run's own pace by a median 11.7% over four validation runs, 4.5% over
    # seven with the points settled (docs/figures.md "the grid, settled"). 0: time from the first step, as
    # profiles made before this key did.
    settle_steps: int = 8
    # prefill forwards timed per token count (each its own served burst: one prefill forward apiece); the
    # point is their median, as a decode point is its steps'
    prefill_samples: int = 3
    warmup: int = 1  # untimed passes over the smallest point first (kernels compiled, caches warm)
    # The grid measured this many times over, in turn, each point the median of its samples from all passes
    # (harness/scenarios/profile_grid.py GridSampler says why; with wall=true, spread over the wall runs). Odd
    # is best for the drift: the last pass then runs in the first one's order.
    passes: int = 3
    rates: List[float] = field(default_factory=list)  # arrival.rate values to simulate on the profile
    # arrival.rate values also simulated with chunked_prefill=true and max_num_batched_tokens=chunked_budget
    # (mixed steps priced from the same profile), beside wall-clock runs of those settings
    chunked_rates: List[float] = field(default_factory=list)
    chunked_budget: int = 128
    max_rate: bool = False  # also search the largest rate within the SLO on the profiled clock
    # Also serve the workload on the wall clock at every rate above (and search the max rate on it), in
    # this job's process, between the profile's passes: the rows the validation compares the simulated ones
    # with (harness/scenarios/wall_check.py says why one process); the drift is the last pass against the first.
    wall: bool = False
    start_rps: float = 1.0  # as scenario=max_rate's
    tolerance_rps: float = 0.25
    search_limit: float = 256


SCHEMA = ProfileScenario


def check(job: JobRun) -> None:
    cfg, sc = job.cfg, job.cfg.scenario
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
    if sc.settle_steps < 0:
        raise ConfigError(f"scenario.settle_steps={sc.settle_steps} must be >= 0 (untimed decode steps before a "
                          "point's timed ones)")
    for c in grid_contexts(sc, cfg.max_seq_len):
        if not 1 <= c or c + sc.settle_steps + sc.decode_steps + 1 > cfg.max_seq_len:
            raise ConfigError(f"scenario.contexts holds {c}: each must be >= 1 and leave room for "
                              f"scenario.settle_steps={sc.settle_steps} and scenario.decode_steps={sc.decode_steps} "
                              f"in max_seq_len={cfg.max_seq_len}")
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
    from kvbench.harness.serving.after_idle import AfterIdle
    from kvbench.harness.serving.profiled_clock import ProfilePoints, prefill_path_s

    prefill = [r for r in rows if r["kind"] == "prefill"]
    idle = {r["place"]: r["factor"] for r in rows if r["kind"] == "after_idle"}
    busy = {r["place"]: r["factor"] for r in rows if r["kind"] == "after_busy"}
    after = AfterIdle.from_places(idle, busy or None) if idle else None
    return ProfilePoints(tuple((r["batch"], r["context"], r["seconds"]) for r in rows if r["kind"] == "decode"),
                         tuple((r["tokens"], r["seconds"]) for r in prefill),
                         prefill_path_s((r["tokens"], r.get("attention_seconds")) for r in prefill), after)


def made_by(job: JobRun, impl: ImplConfig) -> Provenance:
    """What measures this job's profile of ``impl``, as its table records it: a run of other settings that
    reads the table is refused, naming them (harness/serving/clocks.py)."""
    from kvbench.harness.serving.profile_table import provenance_of

    fp = job.fingerprint
    return provenance_of(job.cfg, impl.kernel, fp.device_slug, fp.gpu_name or fp.cpu_name, fp.git_sha)


def _simulated(job: JobRun, compute: Compute, impl: ImplConfig, points: ProfilePoints, rate: float,
               chunked_budget: int | None = None) -> dict:
    """The job's workload at ``rate`` on the profiled clock, as a capacity run prices it; with
    ``chunked_budget``, scheduled with chunked prefill under that many tokens a step."""
    from kvbench.harness.scenarios.capacity import simulated_row
    from kvbench.harness.scenarios.wall_check import at_rate, probe_identifiers
    from kvbench.harness.serving.profiled_clock import ProfiledClock

    probe = at_rate(job, compute, rate, chunked_budget)
    clock = ProfiledClock(points)
    return {**probe.call(simulated_row, impl, clock=clock, source=clock.id), **probe_identifiers(probe, impl)}


def _simulated_rows(job: JobRun, compute: Compute, impl: ImplConfig, points: ProfilePoints, rate: float,
                    budget: int | None, pace: float | None) -> list[dict]:
    """The job's workload at ``rate`` on the profiled clock (``_simulated``) and, where the pace meter measured the
    machine's pace in the rate's wall run, on the profile at that pace too (``machine_pace``): the price of the same
    steps on the machine as fast as it was then (harness/measure/pace_meter.py)."""
    rows = [_simulated(job, compute, impl, points, rate, budget)]
    if pace is not None:
        paced = _simulated(job, compute, impl, points.at_pace(pace), rate, budget)
        said = f"priced at the machine's pace in its wall run: {pace:.3f}x the profile's prices"
        rows.append({**paced, "clock_source": rows[0]["clock_source"], "machine_pace": pace,
                     "notes": " | ".join(n for n in (said, paced.get("notes")) if n)})
    return rows


def recheck(job: JobRun, workload: JobWorkload, compute: Compute, impl: ImplConfig) -> list[dict]:
    """Part of a one-pass profile timed again at a validating job's end, for its drift: every context at the
    middle batch of the grid, and the second smallest prefill point (a few seconds at tiny scale); the
    prompts are the first pass's."""
    batches, contexts, prefill = profile_grid(job.cfg, compute.model.gemm_row_breaks())
    grid = ([batches[len(batches) // 2]], contexts, prefill[1:2] or prefill)
    sampler = GridSampler(job, workload, compute, impl, grid)
    sampler.measure_pass()
    return sampler.rows()


def _probed(job: JobRun, measure: Callable[[], None], seen: list) -> Callable[[], None]:
    """``measure`` with the CPU it got recorded in ``seen`` (harness/measure/contention.py), on a CPU."""
    from kvbench.harness.measure.contention import probe_for

    def run() -> None:
        probe = probe_for(job.device.type)
        if probe is None:
            return measure()
        with probe:
            measure()
        seen.append(probe.result())

    return run


def budget_fits(job: JobRun, impl: ImplConfig, budget: JobBudget):
    """(sequences, context) -> whether the job's KV budget holds that many sequences of that context at once
    (a block of slack each: a step's sequences differ in length), for the grid's reach (profile_grid.py
    ``reach``); None where the scenario names its own batches or contexts: a named grid is measured whole."""
    from kvbench.harness.kv.factory import analytic_max_concurrency

    sc = job.cfg.scenario
    if sc.batches or sc.contexts:
        return None
    kv_bytes, slack = budget.measured().kv_bytes, job.cfg.block_size

    def fits(sequences: int, context: int) -> bool:
        return analytic_max_concurrency(impl, job.cfg, kv_bytes, max(1, context - slack)) >= sequences

    return fits


def prefill_most(job: JobRun, impl: ImplConfig, budget: JobBudget) -> int | None:
    """The most prompt tokens one prefill step of a run of the job's KV budget computes, for the prefill grid's
    reach (profile_grid.py ``prefill_reach``): the most tokens that prompts of one length fit at once (each one
    sequence of the budget, at most ``batch`` of them), over lengths from a block to the longest prompt (a paged
    pool's most at whole blocks, a contiguous one's at the longest prompt); None where the scenario names its own
    prefill points: a named grid is measured whole."""
    from kvbench.harness.kv.factory import analytic_max_concurrency

    cfg = job.cfg
    if cfg.scenario.prefill_tokens:
        return None
    kv_bytes, top = budget.measured().kv_bytes, cfg.max_seq_len - 1
    lengths = {top} | {cfg.block_size << k for k in range(32) if cfg.block_size << k < top}
    return max(min(cfg.batch, analytic_max_concurrency(impl, cfg, kv_bytes, n)) * n for n in lengths)


def run(job: JobRun, workload: JobWorkload, compute: Compute, budget: JobBudget, out: Outputs,
        impl: ImplConfig) -> list[dict]:
    from kvbench.harness.measure.contention import with_contention
    from kvbench.harness.measure.pace_meter import PaceMeter, pace
    from kvbench.harness.serving.after_idle import MIN_IDLE_S
    import pandas as pd

    from kvbench.harness.scenarios.after_idle_probe import after_idle_rows
    from kvbench.harness.serving.after_idle import DECODE_BINS
    from kvbench.harness.scenarios.max_rate import probe_record, search_rate
    from kvbench.harness.scenarios.wall_check import WallRuns, drift, priced
    from kvbench.harness.serving.profile_table import profile_frame
    from kvbench.harness.serving.profiled_clock import ProfiledClock, profile_id
    from kvbench.harness.serving.service_metrics import slo_label
    from kvbench.harness.serving.timeline import append_table

    check(job)
    sc = job.cfg.scenario
    batches, contexts, prefill = profile_grid(job.cfg, compute.model.gemm_row_breaks())
    most = prefill_most(job, impl, budget)
    grid = (batches, contexts, prefill if most is None else prefill_reach(prefill, most))
    if sc.wall and job.device.type == "cpu":  # the machine's pace, timed in this thread (pace_meter.py says why)
        compute.pace = PaceMeter.of_model(compute.model, MIN_IDLE_S)
    sampler = GridSampler(job, workload, compute, impl, grid, budget_fits(job, impl, budget))
    sampler.warm_up(sc.warmup)
    runs = [(rate, None) for rate in sc.rates] + [(rate, sc.chunked_budget) for rate in sc.chunked_rates]
    walls = WallRuns(job, compute, out, impl, runs, sc.max_rate)
    # With wall=true the profile's later passes are spread over the wall runs, so that the profile samples the
    # machine over the minutes they do (on the 2-core CPU machines its speed moved 5-15% within a job's few
    # minutes, with no other process in sight).
    tasks = walls.tasks() if sc.wall else []
    seen: list = []  # the CPU each pass got
    measure_pass = _probed(job, sampler.measure_pass, seen)
    try:
        measure_pass()
        interleaved(tasks, sc.passes - 1, measure_pass)
    finally:
        compute.pace = None
    rows = sampler.rows()
    # the steps after a sleep, each over its price on the grid its pass measured (harness/scenarios/after_idle_probe.py)
    rows += after_idle_rows(impl.name, [(got, ProfiledClock(points_of(sampler.rows(slice(n, n + 1)))))
                                        for n, got in enumerate(sampler.idle)])
    append_table(out.tables, "profile", profile_frame(rows, made_by(job, impl)))
    points = points_of(rows)
    pid = profile_id(points)
    spread = f"; measured in {sc.passes} passes spread over the wall runs" if tasks and sc.passes > 1 else ""
    after = points.after_idle
    idle = (f"; after a sleep: the prefill at {after.prefill:.2f}x its price, decode steps "
            + ", ".join(f"{f:.2f}x" for k, f in after.decode if k in DECODE_BINS)
            + ("" if after.busy is None else f"; a busy prefill at {after.busy.prefill:.2f}x, decode steps after it "
               + ", ".join(f"{f:.2f}x" for k, f in after.busy.decode if k in DECODE_BINS))
            if after else "; no after-idle factors (the probe left a place without a step, or measured "
            "a factor outside [0.2, 5]: every step priced as its grid)")
    summary = {"status": "ok", "clock_source": pid, "probes": len(rows), **attention_shares(rows),
               "notes": f"{len(points.decode)} decode and {len(points.prefill)} prefill points{spread}{idle}; "
                        f"clock_profile={job.run_id} prices a simulated run from them"}
    if seen:  # the pass whose CPU was the most contended speaks for the profile
        summary = with_contention(summary, max(seen, key=lambda c: (c.contended, c.others_cpu or 0.0)))
    result = [summary]
    for frame in walls.steps:  # each wall step beside its price on the whole profile
        append_table(out.tables, "steps", priced(frame, ProfiledClock(points)))
    for i, (rate, budget) in enumerate(runs):  # each rate on both clocks, the wall row first
        at = pace(walls.paced.get(i, []), sampler.pace_s)
        if i in walls.rows:
            result.append({**walls.rows[i], "machine_pace": at})
        result += _simulated_rows(job, compute, impl, points, rate, budget, at)
    if sc.max_rate:
        # Both searches' probes in the job's rate_probes table, told apart by ``clock``: where the two
        # clocks' verdicts part, and by how much normalized latency.
        at = pace(walls.search_paced, sampler.pace_s)
        if walls.searched is not None:
            result.append({**walls.searched, "machine_pace": at})
        for priced in [points] + ([points.at_pace(at)] if at is not None else []):
            def passes(rate: float, priced=priced) -> bool:
                row = _simulated(job, compute, impl, priced, rate)
                if priced is points:  # the probes of the search at the profile's own prices
                    walls.listed.append(probe_record(impl.name, job.run_id, rate, row, "simulated"))
                return bool(row.get("slo_pass"))

            found, probes = search_rate(passes, sc.start_rps, sc.search_limit, sc.tolerance_rps)
            paced = {} if priced is points else {"machine_pace": at}
            said = "" if priced is points else f", priced at the machine's pace in the wall search: {at:.3f}x"
            result.append({"status": "ok", "clock": "simulated", "clock_source": pid, "arrival": job.cfg.arrival.name,
                           "slo": slo_label(job.cfg.slo), "max_rate_rps": found, "probes": probes, **paced,
                           "notes": f"max rate within the SLO on the profiled clock{said}; {probes} probes"})
        append_table(out.tables, "rate_probes", pd.DataFrame(walls.listed))
    if sc.wall:  # how far the machine moved while the wall runs ran: the last pass against the first
        last = sampler.rows(slice(-1, None)) if len(sampler.passes) > 1 else recheck(job, workload, compute, impl)
        summary["profile_drift"] = drift(sampler.rows(slice(0, 1)), last)
    return result
