"""scenario=capacity: the scheduler and cache bookkeeping alone, at full model scale.

No tensors and no model compute: the same ``Scheduler`` and allocators as the
decode scenario run the workload under a memory budget, admitting under the same
``max_num_batched_tokens`` per prefill step. harness/simulator.py runs it event
by event (allocations, finishes), with exactly the figures of a step-by-step run;
``decode_steps`` counts decode steps as the decode engine does. Generated tokens
are synthetic (a fixed function of request and sample).
"""

from __future__ import annotations

import statistics
import time

import pandas as pd

from harness.budget import kv_budget
from harness.config import Config, ImplConfig
from harness.context import RunContext, run_id
from harness.cost_model import cost_model_for
from harness.metrics import per_second
from harness.service_metrics import service_columns
from harness.simulator import simulate
from harness.timeline import append_table, requests_table, simulated_steps_table
from harness.workload import Request, generate_requests
from impls.allocator import KVAllocator
from impls.block_manager import BlockManager
from harness.cache_factory import analytic_max_concurrency, build_allocator
from impls.lane_allocator import LaneAllocator
from impls.sizing import blocks_for_tokens


def _unbounded(variant: str, requests: list[Request], cfg: Config) -> KVAllocator:
    seqs = sum(r.n for r in requests)
    if variant == "contiguous":
        return LaneAllocator(seqs, cfg.max_seq_len)
    blocks = sum(r.n * blocks_for_tokens(r.total_len, cfg.block_size) + r.n for r in requests)
    return BlockManager(blocks, cfg.block_size, prefix_caching=(variant == "paged_shared"))


def _unshared(requests: list[Request]) -> list[Request]:
    """Parallel samples as independent requests: what paging without sharing stores."""
    return [Request(r.request_id * r.n + k, r.prompt_ids, r.output_len, 1) for r in requests for k in range(r.n)]


def concurrency_points(ctx: RunContext, kv_bytes: int) -> pd.DataFrame:
    """Memory needed to serve N concurrent requests, per variant (the seeds' experiment)."""
    cfg = ctx.cfg
    points = sorted(set(cfg.scenario.concurrency_points))
    pool = generate_requests(cfg.workload, max(points), cfg.model.vocab_size, cfg.max_seq_len, cfg.seed)
    rows = []
    for n_req in points:
        reqs = pool[:n_req]
        for variant in ("contiguous", "paged", "paged_shared"):
            run_reqs = _unshared(reqs) if variant == "paged" else reqs
            sim = simulate(_unbounded(variant, run_reqs, cfg), run_reqs, sum(r.n for r in run_reqs),
                           cfg.max_num_batched_tokens, cfg.model.vocab_size, ctx.bytes_per_token)
            rows.append({"concurrency": n_req, "variant": variant, "model": cfg.model.name,
                         "dtype": cfg.dtype, "block_size": cfg.block_size, "max_seq_len": cfg.max_seq_len,
                         "workload": cfg.workload.name, "n": cfg.workload.n,
                         "shared_prefix_len": cfg.workload.shared_prefix_len,
                         "kv_bytes_reserved": sim.peaks.reserved_bytes, "kv_bytes_used": sim.peaks.used_bytes,
                         "budget_kv_bytes": kv_bytes, "device_slug": ctx.fingerprint.device_slug,
                         "run_id": run_id(ctx.run_dir)})
    return pd.DataFrame(rows)


def run(ctx: RunContext, impl: ImplConfig) -> list[dict]:
    return [simulated_row(ctx, impl, points=True)]


def simulated_row(ctx: RunContext, impl: ImplConfig, points: bool = False) -> dict:
    """One impl's capacity row; with ``gpu=NAME`` also its service columns on the simulated clock
    (and its ``requests``/``steps`` tables). ``points``: add the memory-vs-concurrency table."""
    cfg = ctx.cfg
    requests = ctx.requests
    # Weights from the shape, activations estimated; nothing is allocated.
    budget = kv_budget(cfg, prompt_lens=[len(r.prompt_ids) for r in requests])
    allocator = build_allocator(impl, cfg, budget.kv_bytes)
    clock = cost_model_for(cfg) if cfg.gpu is not None else None
    arrivals = [r.arrival_s for r in requests] if clock is not None else None
    t0 = time.perf_counter()
    sim = simulate(allocator, requests, cfg.batch, cfg.max_num_batched_tokens, cfg.model.vocab_size,
                   ctx.bytes_per_token, clock=clock, arrival_s=arrivals)
    wall = time.perf_counter() - t0
    if points and "points" not in ctx.tables:
        ctx.tables["points"] = concurrency_points(ctx, budget.kv_bytes)
    output_tokens = sum(r.output_len * r.n for r in requests) if not sim.rejected else None
    prompt_tokens = sum(len(r.prompt_ids) for r in requests)
    service = {}
    if clock is not None:
        service = service_columns(cfg.arrival, cfg.slo, requests, sim.sequences, sim.elapsed_s, sim.idle_s,
                                  "simulated", itl=sim.itl)
        # As the decode rows define them, over the run's duration (here the simulated clock's).
        if output_tokens is not None:
            service["tokens_per_s"] = per_second(prompt_tokens + output_tokens, sim.elapsed_s)
            service["output_tokens_per_s"] = per_second(output_tokens, sim.elapsed_s)
        if cfg.timeline_tables:
            rid = run_id(ctx.run_dir)
            append_table(ctx.tables, "requests", requests_table(sim.sequences, impl.name, rid))
            append_table(ctx.tables, "steps", simulated_steps_table(sim.records, impl.name, rid))
    mean_len = round(statistics.mean(r.total_len for r in requests))
    rejected = "; ".join(f"request {s.request_id} rejected: {why}" for s, why in sim.rejected[:5])
    notes = " | ".join(ctx.workload_notes + ([rejected] if rejected else [])) or None
    return {
        "status": "ok",
        "notes": notes,
        "wall_s": wall,
        "decode_steps": sim.decode_steps,  # as the decode engine counts them (prefill steps apart)
        "peak_concurrency": sim.peak_running,
        "max_concurrency": sim.max_concurrency,
        "max_concurrency_analytic": analytic_max_concurrency(impl, cfg, budget.kv_bytes, mean_len),
        "preemptions": sim.preemptions,
        "rejected": len(sim.rejected),
        "output_tokens": output_tokens,
        "prompt_tokens": prompt_tokens,
        "cache_hit_tokens": allocator.cache_hit_tokens,
        **sim.peaks.as_row(),
        **{k: v for k, v in budget.as_row().items() if k in ("budget_kv_bytes", "budget_device_bytes", "budget_source")},
        "weight_bytes": budget.weight_bytes,
        "gpu": f"{cfg.gpu.count}x {cfg.gpu.name}" if cfg.gpu is not None else None,
        **service,
    }
