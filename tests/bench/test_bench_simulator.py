"""pytest-benchmark: the event-driven capacity simulator (`make bench`).

The README's 70B capacity run (Llama-3.1-70B, bf16, chat requests of 512 + 256
tokens on average, batch 256, a 640 GB budget) at a fifth of its 10,000 requests,
so that `make test` runs it once quickly; and issue 25's scheduler case, the same
requests 10,000 strong in a pool of 8,000 blocks of 16 (memory-bound: it preempts),
on the bookkeeping alone and on the simulated clock of 2x H100-SXM. Each round builds
a fresh allocator and simulates every request to the end. Figures, not assertions:
nothing checks a speed.
"""

from __future__ import annotations

import pytest

from kvbench.harness.kv.budget import kv_budget
from kvbench.harness.kv.factory import build_allocator
from kvbench.harness.kv.sizes import kv_bytes_per_token
from kvbench.harness.front.groups import load_impl
from kvbench.harness.front.resolve import resolve
from kvbench.harness.serving.clocks import step_clock
from kvbench.harness.serving.simulator import simulate
from kvbench.harness.serving.workload import generate_requests

REQUESTS = 2000
README_70B = ["scenario=capacity", "model=llama-3.1-70b", "dtype=bfloat16", "max_seq_len=4096", "batch=256",
              "workload=chat", "workload.prompt_len=512", "workload.output_len=256", "device.memory_gb=640"]


@pytest.mark.parametrize("impl", ["contiguous", "paged"])
def test_bench_simulate_70b_chat(benchmark, compose, impl):
    cfg = resolve(compose([*README_70B, f"workload.num_requests={REQUESTS}"]))
    requests = generate_requests(cfg.workload, REQUESTS, cfg.model.vocab_size, cfg.max_seq_len, cfg.seed)
    kv_bytes = kv_budget(cfg, prompt_lens=[len(r.prompt_ids) for r in requests]).kv_bytes
    config = load_impl(impl)

    def run():
        allocator = build_allocator(config, cfg, kv_bytes)
        return simulate(allocator, requests, cfg.batch, cfg.max_num_batched_tokens, cfg.model.vocab_size,
                        kv_bytes_per_token(cfg.model, cfg.dtype))

    sim = benchmark(run)
    assert sim.finished == REQUESTS and not sim.rejected and sim.peak_running == cfg.batch


# Issue 25's case: `device.kv_cache_gb` fixes the pool at 8,000 blocks of 16 tokens.
ISSUE_25 = ["scenario=capacity", "model=llama-3.1-70b", "dtype=bfloat16", "max_seq_len=4096", "batch=256",
            "workload=chat", "workload.prompt_len=512", "workload.output_len=256", "workload.num_requests=10000",
            "device.kv_cache_gb=41.94304"]


@pytest.mark.parametrize("device", ["device.memory_gb=80", "gpu=h100-sxm gpu.count=2"], ids=["bookkeeping", "clocked"])
def test_bench_simulate_issue_25_memory_bound(benchmark, compose, device):
    cfg = resolve(compose([*ISSUE_25, *device.split(), "+impl=paged"]))
    requests = generate_requests(cfg.workload, cfg.workload.num_requests, cfg.model.vocab_size, cfg.max_seq_len,
                                 cfg.seed)
    kv_bytes = kv_budget(cfg, prompt_lens=[len(r.prompt_ids) for r in requests]).kv_bytes
    config = cfg.impl  # +impl=paged, resolved to the device's native kernel
    clock, _ = step_clock(cfg, config.name)
    arrivals = [r.arrival_s for r in requests] if clock is not None else None

    def run():
        allocator = build_allocator(config, cfg, kv_bytes)
        assert allocator.num_blocks == 8000 and allocator.block_size == 16
        return simulate(allocator, requests, cfg.batch, cfg.max_num_batched_tokens, cfg.model.vocab_size,
                        kv_bytes_per_token(cfg.model, cfg.dtype), clock=clock, arrival_s=arrivals)

    sim = benchmark(run)
    assert sim.finished == len(requests) and not sim.rejected
    assert sim.preemptions > 0 and (sim.elapsed_s is not None) == (clock is not None)


# Issue 25's goal: the same case at 100,000 requests within 20 CPU s for the whole process. One round each
# (~20 s of simulation here), so only `make bench` (--benchmark-enable) runs them; `make test` skips them.
ISSUE_25_100K = [*ISSUE_25, "workload.num_requests=100000", "device.memory_gb=80", "+impl=paged"]


def test_bench_simulate_issue_25_100k(benchmark, compose):
    if benchmark.disabled:
        pytest.skip("100,000 requests: `make bench` only")
    cfg = resolve(compose(ISSUE_25_100K))
    requests = generate_requests(cfg.workload, cfg.workload.num_requests, cfg.model.vocab_size, cfg.max_seq_len,
                                 cfg.seed)
    kv_bytes = kv_budget(cfg, prompt_lens=[len(r.prompt_ids) for r in requests]).kv_bytes
    config = cfg.impl  # +impl=paged, resolved to the device's native kernel

    def run():
        return simulate(build_allocator(config, cfg, kv_bytes), requests, cfg.batch, cfg.max_num_batched_tokens,
                        cfg.model.vocab_size, kv_bytes_per_token(cfg.model, cfg.dtype))

    sim = benchmark.pedantic(run, rounds=1, iterations=1)
    assert sim.finished == len(requests) and not sim.rejected and sim.preemptions > 0


def test_bench_workload_issue_25_100k(benchmark, compose):
    """What the process does with the 100,000 requests outside the simulation: draw them, hash them into
    the rows' workload_digest, and measure their ideal prefix hit rate."""
    if benchmark.disabled:
        pytest.skip("100,000 requests: `make bench` only")
    from kvbench.harness.serving.prefix_reuse import ideal_prefix_reuse
    from kvbench.harness.serving.workload import workload_digest

    cfg = resolve(compose(ISSUE_25_100K))

    def run():
        requests = generate_requests(cfg.workload, cfg.workload.num_requests, cfg.model.vocab_size,
                                     cfg.max_seq_len, cfg.seed)
        return workload_digest(requests), ideal_prefix_reuse((r.prompt_ids for r in requests), cfg.block_size)

    digest, reuse = benchmark.pedantic(run, rounds=1, iterations=1)
    assert len(digest) == 16 and reuse.hit_tokens == 0  # chat prompts share nothing
