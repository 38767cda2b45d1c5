"""Timing of one callable: ``warmup`` untimed calls, then ``iters`` timed calls, one sample each.

The loop is the same on every device; only the clock differs. On CPU each call is timed
with ``time.perf_counter``. On CUDA each call sits between two CUDA events, read after
one synchronisation at the end, and the L2 cache is flushed before each call (outside
the events), as ``triton.testing.do_bench`` does, so a small batch's K/V are read from
HBM on every call, not from the L2 the previous call left them in. Between the flush and
the start event the GPU spins (``torch.cuda._sleep``) for longer than the host takes to
enqueue the call: otherwise, whenever the host is slower than the flush, the GPU idles
after the start event until the kernel arrives, and the figure is the host's launch time,
not the kernel's. Reports the median and the 10th/90th percentiles in seconds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from kvbench.harness.measure.metrics import percentile

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


class GpuOps(Protocol):
    """What ``CudaEventClock`` asks of the device (a fake in the CPU tests checks their order)."""

    def flush(self) -> None: ...

    def spin(self, seconds: float) -> None:
        """Keep the device busy for about ``seconds`` (enqueued; the host does not wait)."""

    def event(self) -> object:
        """A timing event, not yet recorded (``record()``, ``elapsed_time(other)`` in ms)."""

    def synchronize(self) -> None: ...


class TorchCudaOps:
    def __init__(self, device: torch.device) -> None:
        self._flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=device)
        try:  # SM cycles per second, for _sleep's cycle count (NVML through torch; 2 GHz if unknown)
            self._hz = torch.cuda.clock_rate(device) * 1e6 or 2e9
        except Exception:  # noqa: BLE001 - pynvml missing or no reading: an upper bound is enough
            self._hz = 2e9

    def flush(self) -> None:
        self._flush.zero_()

    def spin(self, seconds: float) -> None:
        torch.cuda._sleep(int(seconds * self._hz))

    def event(self) -> object:
        return torch.cuda.Event(enable_timing=True)

    def synchronize(self) -> None:
        torch.cuda.synchronize()


# The host's time to enqueue the start event, the call and the end event, times this, is how long
# the device spins before the start event; at least MIN_SPIN_S.
SPIN_MARGIN = 2.0
MIN_SPIN_S = 20e-6


class CudaEventClock:
    """Device time per call between CUDA events, read once at the end (no sync between calls).

    Each call: flush the L2, spin the device past the host's enqueue time, start event, call,
    end event. The enqueue time is measured on the first call (``calibrate``, in warm-up).
    """

    method = "cuda-events"

    def __init__(self, device: torch.device | None = None, ops: GpuOps | None = None) -> None:
        self.ops = ops if ops is not None else TorchCudaOps(device)
        self.spin_s = MIN_SPIN_S

    def calibrate(self, fn: Callable[[], object]) -> None:
        """Measure how long the host takes to enqueue ``fn`` between two events; spin that long and more."""
        start, end = self.ops.event(), self.ops.event()
        t0 = time.perf_counter()
        start.record()
        fn()
        end.record()
        host_s = time.perf_counter() - t0
        self.ops.synchronize()
        self.spin_s = max(MIN_SPIN_S, SPIN_MARGIN * host_s)

    def time(self, fn: Callable[[], object]) -> tuple:
        self.ops.flush()
        self.ops.spin(self.spin_s)  # the device is still busy when the start event is reached
        start, end = self.ops.event(), self.ops.event()
        start.record()
        fn()
        end.record()
        return start, end

    def seconds(self, handles: list) -> list[float]:
        self.ops.synchronize()
        return [start.elapsed_time(end) / 1e3 for start, end in handles]


def clock_for(device: torch.device) -> Clock:
    return CudaEventClock(device) if device.type == "cuda" else HostClock()


def time_call(fn: Callable[[], object], device: torch.device, warmup: int, iters: int,
              clock: Clock | None = None) -> Timing:
    """``warmup`` untimed calls of ``fn``, then ``iters`` (at least 1) timed ones on ``device``'s clock."""
    clock = clock or clock_for(device)
    for _ in range(warmup):
        fn()
    if hasattr(clock, "calibrate"):  # warm now: the enqueue time is the measured calls' own
        clock.calibrate(fn)
    samples = clock.seconds([clock.time(fn) for _ in range(max(1, iters))])
    return Timing(percentile(samples, 50), percentile(samples, 10), percentile(samples, 90), clock.method)


def copy_bandwidth_gbps(device: torch.device, num_bytes: int, warmup: int = 2, iters: int = 5) -> float:
    """Measured device-to-device copy (read + write bytes / time): the practical roofline."""
    src = torch.empty(num_bytes // 4, dtype=torch.float32, device=device).normal_()
    dst = torch.empty_like(src)
    t = time_call(lambda: dst.copy_(src), device, warmup, iters)
    return 2 * src.numel() * 4 / t.median_s / 1e9
