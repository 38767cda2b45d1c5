"""scenario=decode: end-to-end generation of the workload through one KV-cache impl."""

from __future__ import annotations

import contextlib
import gc
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvbench.harness.config import ImplConfig, ScenarioConfig

if TYPE_CHECKING:  # reading a config imports this module; running it loads torch
    from kvbench.harness.kv.budget import MemoryBudget
    from kvbench.harness.measure.pace_meter import PaceMeter
    from kvbench.harness.scenarios.compute import Compute
    from kvbench.harness.scenarios.job_budget import JobBudget
    from kvbench.harness.scenarios.job_run import JobRun
    from kvbench.harness.scenarios.job_workload import JobWorkload
    from kvbench.harness.scenarios.outputs import Outputs
    from kvbench.harness.serving.engine import EngineResult
    from kvbench.harness.serving.reuse_meter import ReuseMeter
    from kvbench.harness.serving.workload import Request


@dataclass
class DecodeScenario(ScenarioConfig):
    """End-to-end generation with a real model (harness/scenarios/decode.py)."""

    name: str = "decode"
    warmup: int = 1  # warm-up passes over a few requests before the measured run
    # At a quantized kv_dtype (and with workload=text), after the timed runs: the same requests at
    # kv_dtype=auto, teacher-forced agreement, KL, perplexity and the gate (harness/serving/kv_accuracy.py).
    accuracy: bool = True


SCHEMA = DecodeScenario


@dataclass(frozen=True)
class RunReuse:
    """One repeat's requests as served (a closed loop's with the arrival times the run gave them) and
    its prefix-cache reuse (harness/serving/reuse_meter.py)."""

    served: list[Request]
    meter: ReuseMeter


def warmup_requests(requests: list[Request]) -> list[Request]:
    """A few short requests, to compile kernels and fill caches before measuring."""
    from kvbench.harness.serving.workload import Request

    return [Request(r.request_id, r.prompt_ids[:16], min(r.output_len, 4), 1) for r in requests[:2]]


def _paced(meter: ReuseMeter, pace: PaceMeter):
    """The step observer of a measured run of a validating job: the reuse meter, then the pace meter's tick."""
    def observe(rec, plan, finished) -> None:
        meter(rec, plan, finished)
        pace.observe(rec, plan, finished)

    return observe


def _run_once(job: JobRun, workload: JobWorkload, compute: Compute, impl: ImplConfig, kv: MemoryBudget,
              requests: list[Request], track: bool):
    import torch

    from kvbench.harness.kv.factory import analytic_max_concurrency, build_cache
    from kvbench.harness.measure.memory import MemoryTracker
    from kvbench.harness.serving.engine import Engine
    from kvbench.harness.serving.reuse_meter import ReuseMeter

    cache = build_cache(impl, job.cfg, kv.kv_bytes, job.device)
    total = sum(r.output_len * r.n for r in requests)
    update, close = compute.progress(total, impl.name) if track else (None, lambda: None)
    engine = Engine(compute.model, cache, job.cfg.batch, job.cfg.max_num_batched_tokens, sync=compute.sync,
                    progress=update, pieces=compute.decode_pieces, compiled=compute.decode_compiled,
                    chunked_prefill=job.cfg.chunked_prefill)
    tracker = MemoryTracker(job.device.type)
    # A closed loop (workload.kind=multi_turn) decides arrivals as it runs; warm-up runs its few requests open.
    source = workload.request_source() if track else None
    meter = ReuseMeter(cache.allocator)
    try:
        with tracker:
            result = engine.run([] if source is not None else requests, source=source,
                                observer=meter if compute.pace is None or not track else _paced(meter, compute.pace))
    finally:
        close()
    # What the repeat served, with the arrival times it had, and how much it reused.
    reuse = RunReuse(source.released if source is not None else requests, meter)
    max_conc = analytic_max_concurrency(impl, job.cfg, kv.kv_bytes,
                                        round(statistics.mean(r.total_len for r in requests)))
    del engine, cache
    gc.collect()
    if job.device.type == "cuda":
        torch.cuda.empty_cache()
    return result, tracker.report, max_conc, reuse


def _row(job: JobRun, workload: JobWorkload, compute: Compute, results: list[EngineResult], mem, max_conc: int,
         kv: MemoryBudget, reuse: RunReuse) -> dict:
    from kvbench.harness.kv.budget import budget_limit_note
    from kvbench.harness.measure.metrics import median_and_spread, ms, output_digest, per_second, percentile
    from kvbench.harness.serving.closed_loop import unsent_note
    from kvbench.harness.serving.service_metrics import service_columns

    res = results[len(results) // 2]  # a representative repeat for the non-timing columns
    requests = workload.requests
    output_tokens = sum(len(s.output_ids) for s in res.sequences)
    prompt_tokens = sum(len(r.prompt_ids) for r in requests)
    walls = [r.elapsed_s for r in results]
    tps, spread = median_and_spread([per_second(prompt_tokens + output_tokens, w) for w in walls])
    wall = statistics.median(walls)
    digests = {output_digest((s.request_id, s.sample, s.output_ids) for s in r.sequences) for r in results}
    notes = workload.notes + ([mem.notes] if mem.notes else [])
    if len(digests) > 1:
        notes.append(f"repeats generated different tokens ({len(digests)} digests)")
    if note := budget_limit_note(job.cfg, res.memory_bound_steps, res.decode_steps, res.peak_running, res.preemptions):
        notes.append(note)
    if res.rejected:
        notes.append("rejected: " + "; ".join(f"request {s.request_id}: {why}" for s, why in res.rejected[:5]))
    if unsent := unsent_note(len(requests), len(reuse.served)):  # a closed loop's turns after a rejected one
        notes.append(unsent)
    return {
        "status": "ok",
        "notes": " | ".join(notes) or None,
        "wall_s": wall,
        "tokens_per_s": tps,
        "tokens_per_s_spread": spread,
        "output_tokens_per_s": per_second(output_tokens, wall),
        "requests_per_s": per_second(len(requests), wall),
        "step_ms_p50": ms(percentile(res.step_s, 50)),
        "step_ms_p90": ms(percentile(res.step_s, 90)),
        "step_ms_p99": ms(percentile(res.step_s, 99)),
        # Prefill steps apart from the decode steps above: a change (kv_dtype's quantizing writes) may
        # move them in opposite directions.
        "prefill_step_ms_p50": ms(percentile(res.prefill_step_s, 50)),
        "prefill_step_ms_p90": ms(percentile(res.prefill_step_s, 90)),
        "host_ms_p50": ms(percentile(res.host_s, 50)),
        "host_ms_p90": ms(percentile(res.host_s, 90)),
        "piecewise_steps": res.piecewise_steps,  # decode steps run as pieces (graph replays when cuda_graph)
        **compute.decode_mode_columns(),
        **service_columns(job.cfg.arrival, job.cfg.slo, reuse.served, res.sequences, res.elapsed_s, res.idle_s, "wall"),
        "output_tokens": output_tokens,
        "prompt_tokens": prompt_tokens,
        "prefill_tokens": res.prefill_tokens,
        **reuse.meter.columns(workload.ideal_hit_rate(), prompt_tokens),
        # steps, concurrency, preemptions and KV peaks: as a capacity row makes them (harness/serving/served_run.py)
        **res.bookkeeping_columns(),
        **res.cache_counters,  # a slab's gathers; a paged cache's are its pool's, above
        "max_concurrency_analytic": max_conc,
        "weight_bytes": kv.weight_bytes,
        "budget_kv_bytes": kv.kv_bytes,
        "budget_device_bytes": kv.device_bytes,
        "budget_source": kv.source,
        "budget_graph_bytes": kv.graph_bytes,
        **{k: v for k, v in mem.as_row().items() if k not in ("samples", "notes")},
        "energy_per_output_token_j": mem.energy_per_token_j(output_tokens),
        "output_digest": next(iter(digests)) if len(digests) == 1 else ",".join(sorted(digests)),
    }


def run(job: JobRun, workload: JobWorkload, compute: Compute, budget: JobBudget, out: Outputs,
        impl: ImplConfig) -> list[dict]:
    from kvbench.kernels.kv_formats import is_quantized

    rows = measure(job, workload, compute, budget, out, impl, job.cfg.scenario.warmup)
    if job.cfg.scenario.accuracy:
        _with_accuracy(job, workload, compute, out, impl, rows[0])
    elif is_quantized(job.cfg.kv_dtype):  # no accuracy columns: the row must not read as checked and fine
        from kvbench.harness.serving.kv_accuracy import unchecked_note

        rows[0]["notes"] = " | ".join(n for n in (rows[0].get("notes"),
                                                  unchecked_note(job.cfg.kv_dtype, "scenario.accuracy=false")) if n)
    return rows


def _with_accuracy(job: JobRun, workload: JobWorkload, compute: Compute, out: Outputs, impl: ImplConfig,
                   row: dict) -> None:
    """The accuracy columns, outside every timed region: at a quantized kv_dtype against kv_dtype=auto,
    and with workload=text the perplexity on the text."""
    from dataclasses import replace

    from kvbench.harness.serving.kv_accuracy import DUMMY_NOTE, measure_kv_accuracy, measure_perplexity, unchecked_note
    from kvbench.kernels.kv_formats import is_quantized

    forced = workload.drawn.continuations
    quantized = is_quantized(job.cfg.kv_dtype)
    if not quantized and forced is None:
        return
    if job.cfg.workload.n != 1:
        one = "it compares one sequence per request"
        note = (unchecked_note(job.cfg.kv_dtype, f"workload.n={job.cfg.workload.n}: {one}") if quantized
                else f"no accuracy check: {one} (workload.n=1)")
        row["notes"] = " | ".join(n for n in (row.get("notes"), note) if n)
        return
    requests = [replace(r, arrival_s=0.0) for r in workload.requests]  # a burst: accuracy needs no arrivals
    if quantized:
        greedy = {t["request_id"]: t["output_ids"] for t in out.tokens if t["impl"] == impl.name}
        cols = measure_kv_accuracy(compute.model, job.cfg, impl, job.device, requests,
                                   None if forced is not None else greedy, forced, sync=compute.sync)
    else:
        cols = measure_perplexity(compute.model, job.cfg, impl, job.device, requests, forced, sync=compute.sync)
    row.update(cols)
    if cols.get("kv_accuracy_weights") == "dummy":
        row["notes"] = " | ".join(n for n in (row.get("notes"), DUMMY_NOTE) if n)


def measure(job: JobRun, workload: JobWorkload, compute: Compute, budget: JobBudget, out: Outputs, impl: ImplConfig,
            warmup: int) -> list[dict]:
    """The decode row after ``warmup`` warm-up passes: the scenario's, or a search's probe (which says how many)."""
    from kvbench.harness.measure.contention import probe_for, with_contention
    from kvbench.harness.serving.timeline import append_table, requests_table, steps_table

    import psutil

    from kvbench.harness.kv.factory import host_tier_note

    host_note = host_tier_note(job.cfg, psutil.virtual_memory().available)  # before the tier takes its RAM
    kv = budget.measured()
    for _ in range(warmup):
        _run_once(job, workload, compute, impl, kv, warmup_requests(workload.requests), track=False)
    results, reuses, mem, max_conc = [], [], None, 0
    probe = probe_for(job.device.type)
    with probe or contextlib.nullcontext():
        for _ in range(job.cfg.repeat):
            res, mem, max_conc, reuse = _run_once(job, workload, compute, impl, kv, workload.requests, track=True)
            results.append(res)
            reuses.append(reuse)
    final, final_reuse = results[len(results) // 2], reuses[len(results) // 2]
    if job.cfg.timeline_tables:
        rid = job.run_id
        append_table(out.tables, "requests", requests_table(final.sequences, impl.name, rid))
        append_table(out.tables, "steps", final_reuse.meter.add_step_columns(steps_table(final.records, impl.name, rid)))
    out.tokens += [
        {"impl": impl.name, "request_id": s.request_id, "sample": s.sample,
         "prompt_ids": s.prompt_ids, "output_ids": s.output_ids}
        for s in final.sequences
    ]
    row = _row(job, workload, compute, results, mem, max_conc, kv, final_reuse)
    from kvbench.kernels.registry import INTERPRETED_NOTE

    interpreted = INTERPRETED_NOTE if job.kernel_backend(impl) == "triton-interpreter" else None
    for note in (host_note, interpreted):  # a host tier that crowded the RAM; Triton's interpreter timed
        if note:
            row["notes"] = " | ".join(n for n in (row.get("notes"), note) if n)
    if probe is not None:
        with_contention(row, probe.result(idle_s=sum(r.idle_s for r in results)))
    return [row]

