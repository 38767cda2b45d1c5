"""A profile's grid (harness/scenarios/profile_grid.py): the points scenario=profile measures."""

from __future__ import annotations

from kvbench.harness.front.resolve import resolve
from kvbench.harness.scenarios.profile_grid import profile_grid


def test_the_default_grids_measure_both_sides_of_every_gemm_kernel_change(compose):
    breaks = (1, 2, 64, 65)  # a packed CPU model's (LlamaModel.gemm_row_breaks)
    cfg = resolve(compose(["scenario=profile", "device=cpu", "batch=32", "max_seq_len=512"]))
    batches, contexts, prefill = profile_grid(cfg, breaks)
    assert batches == [1, 2, 4, 8, 16, 32] and contexts == [16, 38, 89, 210, 495]  # 512 - 8 - 8 - 1 at the top
    # doubling from 16 to 4096 (max_num_batched_tokens 8192 caps nothing below it), and 65 beside 64
    assert prefill == [16, 32, 64, 65, 128, 256, 512, 1024, 2048, 4096]
    assert profile_grid(cfg)[2] == [16, 32, 64, 128, 256, 512, 1024, 2048, 4096]  # no break: no extra point
    wide = compose(["scenario=profile", "batch=100", "max_seq_len=512", "max_num_batched_tokens=50"])
    batches, _, prefill = profile_grid(wide, breaks)
    assert batches == [1, 2, 4, 8, 16, 32, 64, 65, 100] and prefill == [16, 32, 50]  # breaks within range only
    named = compose(["scenario=profile", "batch=100", "scenario.batches=[1,8]", "scenario.prefill_tokens=[16,100]"])
    assert profile_grid(named, breaks)[0::2] == ([1, 8], [16, 100])  # a grid the user names is measured as named


def _pool_fits(tokens: int, block_size: int = 16):
    """A paged pool of ``tokens`` slots: ``n`` sequences of ``context`` tokens fit when their blocks do."""
    return lambda n, context: n * -(-context // block_size) <= tokens // block_size


def test_reach_keeps_every_point_a_step_of_the_budget_prices_on_and_drops_the_rest():
    import random

    from kvbench.harness.scenarios.profile_grid import reach
    from kvbench.harness.serving.profiled_clock import clock_from_rows

    batches, contexts = [1, 2, 4, 8, 16, 32], [16, 38, 90, 212, 503]
    # the CPU clock's budget, 2,048 tokens: a paged cache drops (32, 503) only; a contiguous one holding 4
    # sequences whatever their length, every line past 4
    assert reach(batches, contexts, _pool_fits(2048)) == [(b, c) for b in batches for c in contexts if (b, c) != (32, 503)]
    assert reach(batches, contexts, lambda n, c: n <= 4) == [(b, c) for b in (1, 2, 4) for c in contexts]
    assert reach(batches, contexts, lambda n, c: True) == [(b, c) for b in batches for c in contexts]
    # randomized: every step a budget holds is priced between measured points, never outside them
    rng = random.Random(0)
    for _ in range(200):
        tokens = rng.choice([64, 300, 1000, 2048, 5000, 20000])
        fits = _pool_fits(tokens)
        points = reach(batches, contexts, fits)
        clock = clock_from_rows([(b, c, 1e-3 * b + 1e-5 * c) for b, c in points], [(16, 1e-3)])
        for _ in range(50):
            n = rng.randint(1, 32)
            context = rng.randint(16, 503)
            if fits(n, context + 16):  # held with a block of slack, as profile.py's budget_fits asks
                before = clock.outside
                clock.decode_s(n, n * context)
                assert clock.outside == before, (tokens, n, context, points)


def test_prefill_reach_keeps_the_points_a_budget_s_prefill_steps_price_on():
    import random

    from kvbench.harness.scenarios.profile_grid import prefill_reach
    from kvbench.harness.serving.profiled_clock import clock_from_rows

    grid = [16, 32, 64, 65, 128, 256, 512, 1024, 2048, 4096]
    assert prefill_reach(grid, 2048) == grid[:-1]  # the CPU clock's budget: 4,096 goes
    assert prefill_reach(grid, 2044) == grid[:-1]  # four contiguous lanes of 511-token prompts
    assert prefill_reach(grid, 600) == [16, 32, 64, 65, 128, 256, 512, 1024]
    assert prefill_reach(grid, 10**6) == grid and prefill_reach(grid, 1) == [16]
    rng = random.Random(1)
    for _ in range(300):  # randomized: every step of at most ``most`` tokens is priced inside the kept points
        most = rng.randint(1, 5000)
        kept = prefill_reach(grid, most)
        clock = clock_from_rows([(1, 16, 1e-3)], [(t, 1e-5 * t) for t in kept])
        tokens = rng.randint(1, min(most, grid[-1]))
        before = clock.outside
        clock.prefill_s(tokens)
        assert clock.outside == before, (most, tokens, kept)


def test_prefill_most_is_the_most_prompt_tokens_the_budget_holds_at_once(compose):
    """The CPU clock's settings (batch 32, 512-token context, a 2,048-token KV budget): a paged pool fits 2,048
    prompt tokens (eight 256-token prompts), four contiguous lanes 4 x 511; ``batch`` caps the prompts; a named
    prefill grid is measured whole."""
    from types import SimpleNamespace

    from kvbench.harness.front.resolve import resolve
    from kvbench.harness.kv.sizes import kv_bytes_per_token
    from kvbench.harness.scenarios.profile import prefill_most

    def most(impl: str, *extra: str):
        cfg = resolve(compose([f"+impl={impl}", "scenario=profile", "model=tiny-llama", "device=cpu", "batch=32",
                               "max_seq_len=512", *extra]))
        kv = SimpleNamespace(kv_bytes=2048 * kv_bytes_per_token(cfg.model, cfg.dtype))
        budget = SimpleNamespace(measured=lambda: kv)
        return prefill_most(SimpleNamespace(cfg=cfg), cfg.impl, budget)

    assert most("paged_torch") == 2048
    assert most("contiguous") == 4 * 511
    assert most("paged_torch", "batch=2") == 2 * 511
    assert most("paged_torch", "scenario.prefill_tokens=[16,64]") is None
