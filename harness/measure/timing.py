"""Timing of one callable: CUDA via triton.testing.do_bench, CPU via perf_counter.

Both warm up first and report the median and the 10th/90th percentiles in seconds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from harness.metrics import percentile


@dataclass(frozen=True)
class Timing:
    median_s: float
    p10_s: float
    p90_s: float
    method: str


def time_call(fn: Callable[[], object], device: torch.device, warmup: int, iters: int) -> Timing:
    if device.type == "cuda":
        import triton.testing

        # do_bench flushes L2 between runs and times with CUDA events.
        med, p10, p90 = triton.testing.do_bench(fn, warmup=25, rep=100, quantiles=[0.5, 0.1, 0.9])
        return Timing(med / 1e3, p10 / 1e3, p90 / 1e3, "triton.testing.do_bench")
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(max(1, iters)):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return Timing(percentile(samples, 50), percentile(samples, 10), percentile(samples, 90), "perf_counter")


def copy_bandwidth_gbps(device: torch.device, num_bytes: int, warmup: int = 2, iters: int = 5) -> float:
    """Measured device-to-device copy (read + write bytes / time): the practical roofline."""
    src = torch.empty(num_bytes // 4, dtype=torch.float32, device=device).normal_()
    dst = torch.empty_like(src)
    t = time_call(lambda: dst.copy_(src), device, warmup, iters)
    return 2 * src.numel() * 4 / t.median_s / 1e9
