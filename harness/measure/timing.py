"""Timing of one callable: ``warmup`` untimed calls, then ``iters`` timed calls, one sample each.

The loop is the same on every device; only the clock differs. On CPU each call is timed
with ``time.perf_counter``. On CUDA each call sits between two CUDA events, read after
one synchronisation at the end, and the L2 cache is flushed before each call (outside
the events), as ``triton.testing.do_bench`` does, so a small batch's K/V are read from
HBM on every call, not from the L2 the previous call left them in. Reports the median
and the 10th/90th percentiles in seconds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from harness.measure.metrics import percentile

L2_FLUSH_BYTES = 256 * 2**20  # larger than any GPU's L2 cache (an H200 has 60 MB)


@dataclass(frozen=True)
class Timing:
    median_s: float
    p10_s: float
    p90_s: float
    method: str


class Clock(Protocol):
    method: str

    def time(self, fn: Callable[[], object]) -> object:
        """Call ``fn`` once; a handle on its duration."""

    def seconds(self, handles: list) -> list[float]:
        """The durations behind ``handles``, in seconds."""


class HostClock:
    method = "perf_counter"

    def time(self, fn: Callable[[], object]) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    def seconds(self, handles: list) -> list[float]:
        return handles


class CudaEventClock:
    """Device time per call between CUDA events, read once at the end (no sync between calls)."""

    method = "cuda-events"

    def __init__(self, device: torch.device) -> None:
        self._flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=device)

    def time(self, fn: Callable[[], object]) -> tuple:
        self._flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        return start, end

    def seconds(self, handles: list) -> list[float]:
        torch.cuda.synchronize()
        return [start.elapsed_time(end) / 1e3 for start, end in handles]


def clock_for(device: torch.device) -> Clock:
    return CudaEventClock(device) if device.type == "cuda" else HostClock()


def time_call(fn: Callable[[], object], device: torch.device, warmup: int, iters: int,
              clock: Clock | None = None) -> Timing:
    """``warmup`` untimed calls of ``fn``, then ``iters`` (at least 1) timed ones on ``device``'s clock."""
    clock = clock or clock_for(device)
    for _ in range(warmup):
        fn()
    samples = clock.seconds([clock.time(fn) for _ in range(max(1, iters))])
    return Timing(percentile(samples, 50), percentile(samples, 10), percentile(samples, 90), clock.method)


def copy_bandwidth_gbps(device: torch.device, num_bytes: int, warmup: int = 2, iters: int = 5) -> float:
    """Measured device-to-device copy (read + write bytes / time): the practical roofline."""
    src = torch.empty(num_bytes // 4, dtype=torch.float32, device=device).normal_()
    dst = torch.empty_like(src)
    t = time_call(lambda: dst.copy_(src), device, warmup, iters)
    return 2 * src.numel() * 4 / t.median_s / 1e9
