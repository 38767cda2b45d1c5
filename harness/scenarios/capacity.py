"""scenario=capacity: the scheduler and cache bookkeeping alone, at full model scale.

No tensors and no model compute: the same ``Scheduler`` and allocators as the
decode scenario run the workload under a memory budget, admitting under the same
``max_num_batched_tokens`` per prefill step. harness/serving/simulator.py runs it event
by event (allocations, finishes), with exactly the figures of a step-by-step run;
``decode_steps`` counts decode steps as the decode engine does. Generated tokens
are synthetic (a fixed function of request and sample).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, List

from kvbench.harness.config import ImplConfig, ScenarioConfig

if TYPE_CHECKING:  # reading a config imports this module; running it loads pandas and the impls
    import pandas as pd

    from kvbench.harness.scenarios.job_run import JobRun
    from kvbench.harness.scenarios.job_workload import JobWorkload
    from kvbench.harness.scenarios.outputs import Outputs
    from kvbench.harness.serving.workload import Request


@dataclass
class CapacityScenario(ScenarioConfig):
    """No model compute: the scheduler and cache bookkeeping at full scale (harness/scenarios/capacity.py)."""

    name: str = "capacity"
    # Numbers of concurrent requests for the memory-vs-concurrency table
    concurrency_points: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 100, 128, 256])

    @property
    def bookkeeping(self) -> bool:
        return True


SCHEMA = CapacityScenario

# The memory-vs-concurrency table's variants: (cache kind, shares prefixes, parallel samples stored apart).
POINT_VARIANTS = {"contiguous": ("contiguous", False, False), "paged": ("paged", False, True),
                  "paged_shared": ("paged", True, False)}


def _unshared(requests: list[Request]) -> list[Request]:
    """Parallel samples as independent requests: what paging without sharing stores."""
    from kvbench.harness.serving.workload import Request

    return [Request(r.request_id * r.n + k, r.prompt_ids, r.output_len, 1) for r in requests for k in range(r.n)]


# Memory-vs-concurrency tables this process computed, by everything they read: a sweep's jobs (one process,
# each job a rate or an impl of the same workload) share one instead of simulating it again (~0.5 s a job).
_POINTS: dict[str, pd.DataFrame] = {}


def concurrency_points(job: JobRun, kv_bytes: int) -> pd.DataFrame:
    """Memory needed to serve N concurrent requests, per variant (the seeds' experiment)."""
    from kvbench.harness.kv.factory import pool_spec

    cfg = job.cfg
    key = repr((cfg.workload, cfg.model, cfg.dtype, cfg.seed, cfg.max_num_batched_tokens, job.bytes_per_token,
                cfg.kv_manager,
                sorted(set(cfg.scenario.concurrency_points)), pool_spec(None, cfg, kv_bytes)))
    if key not in _POINTS:
        if len(_POINTS) >= 4:
            _POINTS.pop(next(iter(_POINTS)))
        _POINTS[key] = _concurrency_points(job, kv_bytes)
    return _POINTS[key].assign(device_slug=job.fingerprint.device_slug, run_id=job.run_id)


def _concurrency_points(job: JobRun, kv_bytes: int) -> pd.DataFrame:
    import pandas as pd

    from kvbench.harness.kv.factory import pool_spec, usage_unit_bytes
    from kvbench.harness.kv.groups import state_refusal
    from kvbench.harness.serving.simulator import simulate
    from kvbench.harness.serving.workload import generate_requests
    from kvbench.impls.kinds import cache_kind

    cfg = job.cfg
    points = sorted(set(cfg.scenario.concurrency_points))
    pool = generate_requests(cfg.workload, max(points), cfg.model.vocab_size, cfg.max_seq_len, cfg.seed)
    rows = []
    for n_req in points:
        reqs = pool[:n_req]
        for variant, (kind, shares, apart) in POINT_VARIANTS.items():
            if state_refusal(cfg.model, cfg.kv_manager, kind) is not None:  # lanes hold no linear layer's state
                continue
            run_reqs = _unshared(reqs) if apart else reqs
            spec = replace(pool_spec(None, cfg, kv_bytes), prefix_caching=shares)
            lens = [r.total_len for r in run_reqs for _ in range(r.n)]
            # A grouped pool (kv_manager hybrid/split_pools, a model of several attention kinds) shares prefixes under
            # hybrid only (impls/group_prefix.py); contiguous lanes hold every layer.
            alloc = cache_kind(kind).unbounded_allocator(spec, lens)
            sim = simulate(alloc, run_reqs, sum(r.n for r in run_reqs), cfg.max_num_batched_tokens,
                           cfg.model.vocab_size, usage_unit_bytes(alloc, cfg))
            rows.append({"concurrency": n_req, "variant": variant, "model": cfg.model.name,
                         "kv_manager": cfg.kv_manager, "kv_groups": job.kv_groups,
                         "dtype": cfg.dtype, "block_size": cfg.block_size, "max_seq_len": cfg.max_seq_len,
                         "workload": cfg.workload.name, "n": cfg.workload.n,
                         "shared_prefix_len": cfg.workload.shared_prefix_len,
                         "kv_bytes_reserved": sim.peaks.reserved_bytes, "kv_bytes_used": sim.peaks.used_bytes,
                         "budget_kv_bytes": kv_bytes, "device_slug": None, "run_id": None})  # the job's: above
    return pd.DataFrame(rows)


def cache_by_kind(cfg, impl: ImplConfig, kv_bytes: int, tokens_per_request: int) -> dict:
    """The cache by what it is, beside ``kv_bytes_per_token`` (the per-token part): the fixed state of a sequence
    (linear-attention layers), and an MLA model cached as ordinary attention (every head's K and V) with the
    sequences of ``tokens_per_request`` tokens that budget would hold (paged: whole blocks; contiguous: lanes)."""
    from kvbench.harness.kv.sizes import mha_bytes_per_token, state_bytes_per_seq
    from kvbench.impls.sizing import blocks_for_tokens

    mha = mha_bytes_per_token(cfg.model, cfg.dtype)
    if mha is None:
        held = None
    elif impl.cache == "paged":
        held = kv_bytes // (blocks_for_tokens(tokens_per_request, cfg.block_size) * cfg.block_size * mha)
    else:
        held = kv_bytes // (cfg.max_seq_len * mha)
    return {"state_bytes_per_seq": state_bytes_per_seq(cfg.model, cfg.dtype), "kv_bytes_per_token_mha": mha,
            "max_concurrency_mha_analytic": held}


def run(job: JobRun, workload: JobWorkload, out: Outputs, impl: ImplConfig) -> list[dict]:
    return [simulated_row(job, workload, out, impl, points=True)]


def simulated_row(job: JobRun, workload: JobWorkload, out: Outputs, impl: ImplConfig, points: bool = False,
                  clock=None, source: str | None = None) -> dict:
    """One impl's capacity row; with a clock (``clock_profile=`` or ``gpu=NAME``, or ``clock`` given,
    named ``source``) also its service columns on the simulated clock (and its ``requests``/``steps``
    tables). ``points``: add the memory-vs-concurrency table."""
    from kvbench.harness.kv.budget import kv_budget
    from kvbench.harness.kv.factory import analytic_max_concurrency, build_allocator, usage_unit_bytes
    from kvbench.harness.kv.latent import tp_note
    from kvbench.harness.measure.metrics import per_second
    from kvbench.harness.serving.clocks import outside_note, step_clock
    from kvbench.harness.serving.closed_loop import unsent_note
    from kvbench.harness.serving.profiled_clock import ProfiledClock
    from kvbench.harness.serving.reuse_meter import ReuseMeter
    from kvbench.harness.serving.service_metrics import service_columns
    from kvbench.harness.serving.simulator import simulate
    from kvbench.harness.serving.timeline import append_table, requests_table, steps_table
    from kvbench.kernels.read_pattern import reads_padded

    from kvbench.harness.errors import ConfigError
    from kvbench.harness.kv.groups import state_refusal

    cfg = job.cfg
    refusal = state_refusal(cfg.model, cfg.kv_manager, impl.cache)  # a state only hybrid's grouped pool holds
    if refusal is not None:
        raise ConfigError(refusal)
    requests = workload.requests
    # Weights from the shape, activations estimated; nothing is allocated.
    budget = kv_budget(cfg, prompt_lens=[len(r.prompt_ids) for r in requests])
    allocator = build_allocator(impl, cfg, budget.kv_bytes)
    if clock is None:
        clock, source = step_clock(cfg, impl)
    if isinstance(clock, ProfiledClock) and reads_padded(impl.kernel):
        # A profile is of the impl's own kernel, and prices what it reads: the torch reference's padded
        # window, as its wall steps record it (the roofline prices the PagedAttention kernel's read instead).
        allocator.padded_decode_read = True
    arrivals = [r.arrival_s for r in requests] if clock is not None else None
    loop = workload.request_source()  # a closed loop (workload.kind=multi_turn) decides arrivals as it runs
    meter = ReuseMeter(allocator)
    unit_bytes = usage_unit_bytes(allocator, cfg)  # a grouped pool counts layer slots (impls/group_pool.py)
    t0 = time.perf_counter()
    if loop is None:
        sim = simulate(allocator, requests, cfg.batch, cfg.max_num_batched_tokens, cfg.model.vocab_size,
                       unit_bytes, clock=clock, arrival_s=arrivals, observer=meter,
                       chunked_prefill=cfg.chunked_prefill)
    else:
        sim = simulate(allocator, [], cfg.batch, cfg.max_num_batched_tokens, cfg.model.vocab_size,
                       unit_bytes, clock=clock, observer=meter, source=loop,
                       chunked_prefill=cfg.chunked_prefill)
    wall = time.perf_counter() - t0
    served = loop.released if loop is not None else requests  # with the arrival times they had
    if points and "points" not in out.tables:
        out.tables["points"] = concurrency_points(job, budget.kv_bytes)
    output_tokens = sum(r.output_len * r.n for r in requests) if not sim.rejected else None
    prompt_tokens = sum(len(r.prompt_ids) for r in requests)
    service = {}
    if clock is not None:
        service = service_columns(cfg.arrival, cfg.slo, served, sim.sequences, sim.elapsed_s, sim.idle_s,
                                  "simulated", itl=sim.itl)
        # As the decode rows define them, over the run's duration (here the simulated clock's).
        if output_tokens is not None:
            service["tokens_per_s"] = per_second(prompt_tokens + output_tokens, sim.elapsed_s)
            service["output_tokens_per_s"] = per_second(output_tokens, sim.elapsed_s)
        if cfg.timeline_tables:
            rid = job.run_id
            append_table(out.tables, "requests", requests_table(sim.sequences, impl.name, rid))
            append_table(out.tables, "steps", meter.add_step_columns(steps_table(sim.records, impl.name, rid)))
    mean_len = round(statistics.mean(r.total_len for r in requests))
    rejected = "; ".join(f"request {s.request_id} rejected: {why}" for s, why in sim.rejected[:5])
    outside = outside_note(clock)
    unsent = unsent_note(len(requests), len(served))  # a closed loop's turns after a rejected one
    # A pool with a linear layer's state shares no prefix (impls/group_pool.py); how TP splits a latent or a state.
    cache_notes = (getattr(allocator, "prefix_note", None),
                   tp_note(cfg.model, cfg.gpu.count) if cfg.gpu is not None else None)
    notes = " | ".join(workload.notes + [n for n in (rejected, unsent, outside, *cache_notes) if n]) or None
    return {
        "status": "ok",
        "notes": notes,
        "wall_s": wall,
        # steps (as the decode engine counts them, prefill steps apart), concurrency, preemptions and KV peaks:
        # as a decode row makes them (harness/serving/served_run.py)
        **sim.bookkeeping_columns(),
        "max_concurrency_analytic": analytic_max_concurrency(impl, cfg, budget.kv_bytes, mean_len),
        **cache_by_kind(cfg, impl, budget.kv_bytes, mean_len),
        "output_tokens": output_tokens,
        "prompt_tokens": prompt_tokens,
        **meter.columns(workload.ideal_hit_rate(), prompt_tokens),
        **{k: v for k, v in budget.as_row().items() if k in ("budget_kv_bytes", "budget_device_bytes", "budget_source")},
        "weight_bytes": budget.weight_bytes,
        "gpu": f"{cfg.gpu.count}x {cfg.gpu.name}" if cfg.gpu is not None else None,
        "clock_source": source,  # the profile's id, or roofline: what priced the steps
        **service,
    }
