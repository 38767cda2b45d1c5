"""One record for a served run: the decode engine's and the simulator's give the same bookkeeping columns."""

from __future__ import annotations

import pytest

from kvbench.harness.measure.kv_peaks import KVPeaks
from kvbench.harness.serving.engine import EngineResult
from kvbench.harness.serving.served_run import ServedRun
from kvbench.harness.serving.simulator import Simulation


def test_both_results_are_the_one_record():
    assert issubclass(EngineResult, ServedRun) and issubclass(Simulation, ServedRun)


def test_bookkeeping_columns_name_the_fields_as_a_row_does():
    peaks = KVPeaks(bytes_per_token=4)
    run = ServedRun(sequences=[], rejected=[(None, "too long"), (None, "too long")], peak_running=5,
                    max_concurrency=3, preemptions=2, peaks=peaks, decode_steps=11)
    assert run.bookkeeping_columns() == {"decode_steps": 11, "prefill_steps": 0, "cache_hit_tokens": 0,
                                         "peak_concurrency": 5, "max_concurrency": 3, "preemptions": 2,
                                         "rejected": 2}  # no peaks seen: no KV columns
    with pytest.raises(TypeError):  # every field by name: the two results' own fields keep their positions
        ServedRun([], [], 1, 1, 0, peaks, 1)


@pytest.mark.parametrize("impl", ["paged_torch", "contiguous"])
def test_the_engine_and_the_simulator_give_the_same_bookkeeping(compose, tmp_path, impl):
    """The same requests through the decode engine (tiny model) and the simulator, in a pool tight enough to
    preempt: the same steps, concurrency, preemptions and KV peaks."""
    from kvbench.harness.front.resolve import resolve
    from kvbench.harness.kv.factory import build_allocator, build_cache
    from kvbench.harness.measure.fingerprint import collect
    from kvbench.harness.scenarios.context import JobContext
    from kvbench.harness.serving.engine import Engine
    from kvbench.harness.serving.simulator import simulate

    cfg = resolve(compose([f"+impl={impl}", "model=tiny-llama", "dtype=float32", "device=cpu", "batch=6",
                           "max_seq_len=96", "workload.num_requests=8", "workload.prompt_len=30",
                           "workload.output_len=20"]))
    ctx = JobContext(cfg, tmp_path, collect("cpu"))
    kv_bytes = 200 * ctx.job.bytes_per_token  # 200 tokens for 8 requests of 50: preemptions (paged)
    engine = Engine(ctx.compute.model, build_cache(cfg.impl, cfg, kv_bytes, ctx.job.device), cfg.batch,
                    cfg.max_num_batched_tokens).run(ctx.workload.requests)
    sim = simulate(build_allocator(cfg.impl, cfg, kv_bytes), ctx.workload.requests, cfg.batch, cfg.max_num_batched_tokens,
                   cfg.model.vocab_size, ctx.job.bytes_per_token)
    assert engine.bookkeeping_columns() == sim.bookkeeping_columns()
    assert engine.bookkeeping_columns()["kv_bytes_used"] > 0
    if impl == "paged_torch":
        assert engine.preemptions > 0  # the pool is tight enough to matter
