"""A profile's grid (harness/scenarios/profile_grid.py): the points scenario=profile measures."""

from __future__ import annotations

from kvbench.harness.front.resolve import resolve
from kvbench.harness.scenarios.profile_grid import profile_grid


def test_the_default_grids_measure_both_sides_of_every_gemm_kernel_change(compose):
    breaks = (1, 2, 64, 65)  # a packed CPU model's (LlamaModel.gemm_row_breaks)
    cfg = resolve(compose(["scenario=profile", "device=cpu", "batch=32", "max_seq_len=512"]))
    batches, contexts, prefill = profile_grid(cfg, breaks)
    assert batches == [1, 2, 4, 8, 16, 32] and contexts == [16, 38, 90, 212, 503]
    # doubling from 16 to 4096 (max_num_batched_tokens 8192 caps nothing below it), and 65 beside 64
    assert prefill == [16, 32, 64, 65, 128, 256, 512, 1024, 2048, 4096]
    assert profile_grid(cfg)[2] == [16, 32, 64, 128, 256, 512, 1024, 2048, 4096]  # no break: no extra point
    wide = compose(["scenario=profile", "batch=100", "max_seq_len=512", "max_num_batched_tokens=50"])
    batches, _, prefill = profile_grid(wide, breaks)
    assert batches == [1, 2, 4, 8, 16, 32, 64, 65, 100] and prefill == [16, 32, 50]  # breaks within range only
    named = compose(["scenario=profile", "batch=100", "scenario.batches=[1,8]", "scenario.prefill_tokens=[16,100]"])
    assert profile_grid(named, breaks)[0::2] == ([1, 8], [16, 100])  # a grid the user names is measured as named
