"""Memory tracker: NVML (device and process), torch allocator peaks and process RSS.

Use as a context manager; ``tracker.report`` is a ``MemoryReport`` in bytes.
NVML and RSS are sampled by a background thread so peaks between samples of
the engine's own loop are caught; torch's peaks come from its allocator.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass

import psutil
import torch

from harness.measure import nvml


@dataclass(frozen=True)
class MemoryReport:
    nvml_used_bytes: int | None  # peak device memory in use (all processes)
    nvml_process_bytes: int | None  # peak of this process, as NVML lists it
    nvml_baseline_bytes: int | None  # device memory in use when tracking began
    torch_allocated_bytes: int | None  # peak of torch.cuda.memory_allocated
    torch_reserved_bytes: int | None  # peak of torch.cuda.memory_reserved
    rss_bytes: int  # peak resident set size of this process
    samples: int
    notes: str | None  # why a column is empty

    def as_row(self) -> dict:
        return asdict(self)


class MemoryTracker:
    def __init__(self, device: str, interval_s: float = 0.005, device_index: int = 0) -> None:
        self.device = device
        self.interval_s = interval_s
        self.device_index = device_index
        self.report: MemoryReport | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc = psutil.Process()
        self._nv = self._handle = None
        self._notes: list[str] = []
        self._used = self._proc_used = self._baseline = None
        self._rss = 0
        self._samples = 0

    def _sample(self) -> None:
        self._rss = max(self._rss, self._proc.memory_info().rss)
        if self._nv is not None:
            used, proc = nvml.read_memory(self._nv, self._handle)
            self._used = max(self._used or 0, used)
            if proc is not None:
                self._proc_used = max(self._proc_used or 0, proc)
        self._samples += 1

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> "MemoryTracker":
        nv, reason = nvml._init()
        if nv is None:
            self._notes.append(reason)
        else:
            self._nv = nv
            self._handle = nv.nvmlDeviceGetHandleByIndex(self.device_index)
            self._baseline, _ = nvml.read_memory(nv, self._handle)
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            self._notes.append("torch allocator peaks are CUDA-only (device=cpu)")
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="kvbench-memory", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        alloc = reserved = None
        if self.device == "cuda":
            torch.cuda.synchronize()
            alloc, reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
        if self._nv is not None and self._proc_used is None:
            self._notes.append("NVML lists no memory for this process (container PID namespace?)")
        self.report = MemoryReport(
            nvml_used_bytes=self._used,
            nvml_process_bytes=self._proc_used,
            nvml_baseline_bytes=self._baseline,
            torch_allocated_bytes=alloc,
            torch_reserved_bytes=reserved,
            rss_bytes=self._rss,
            samples=self._samples,
            notes="; ".join(self._notes) or None,
        )
