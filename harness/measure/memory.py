"""Memory and energy tracker: NVML (device and process memory, board energy), torch allocator peaks, RSS.

Use as a context manager around the measured run; ``tracker.report`` is a
``MemoryReport`` in bytes and joules. NVML and RSS are sampled by a background
thread so peaks between samples of the engine's own loop are caught; torch's
peaks come from its allocator; energy is NVML's counter read at both ends. NVML
figures are taken on CUDA runs only, from the GPU torch is using (see nvml.device_handle).
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from time import perf_counter
from typing import Any

import psutil
import torch

from kvbench.harness.measure import nvml

# Each sample is a few NVML calls and a /proc read under the GIL; every 5 ms they competed
# with the engine's Python loop that the run is timing. torch's allocator peaks are exact at
# any interval, so the sampler only has to catch what lives for a few decode steps.
SAMPLE_INTERVAL_S = 0.025
# A sampler stuck inside NVML (a hung driver) must not hang the run: past this the tracker
# leaves the thread behind (a daemon) and makes no more NVML calls.
JOIN_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class MemoryReport:
    nvml_used_bytes: int | None  # peak device memory in use (all processes)
    nvml_process_bytes: int | None  # peak of this process, as NVML lists it
    nvml_baseline_bytes: int | None  # device memory in use when tracking began
    torch_allocated_bytes: int | None  # peak of torch.cuda.memory_allocated
    torch_reserved_bytes: int | None  # peak of torch.cuda.memory_reserved
    rss_bytes: int  # peak resident set size of this process
    energy_j: float | None  # the GPU board's energy over the run (every process on it)
    avg_power_w: float | None  # energy_j / the run's wall time
    samples: int
    notes: str | None  # why a column is empty

    def as_row(self) -> dict:
        return asdict(self)

    def energy_per_token_j(self, tokens: int) -> float | None:
        return self.energy_j / tokens if self.energy_j is not None and tokens > 0 else None


class MemoryTracker:
    def __init__(self, device: str, interval_s: float = SAMPLE_INTERVAL_S,
                 join_timeout_s: float = JOIN_TIMEOUT_S) -> None:
        self.device = device
        self.interval_s = interval_s
        self.join_timeout_s = join_timeout_s
        self.report: MemoryReport | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc = psutil.Process()
        self._nv: Any = None  # pynvml while NVML is read; None without it or once a call got stuck
        self._handle: Any = None
        self._notes: list[str] = []
        self._used = self._proc_used = self._baseline = None
        self._energy_start_mj: int | None = None
        self._t0 = 0.0
        self._rss = 0
        self._samples = 0
        self._failed = 0
        self._first_error: str | None = None

    def _sample(self) -> None:
        # Any error is counted and the first kept for the notes, never raised: in the thread it
        # would vanish, leaving peaks that look complete; in __exit__ it would lose the row.
        try:
            rss = self._proc.memory_info().rss
            nv = self._nv
            used, proc = nvml.read_memory(nv, self._handle) if nv is not None else (None, None)
        except Exception as e:
            self._failed += 1
            self._first_error = self._first_error or f"{e.__class__.__name__}: {e}"
            return
        self._rss = max(self._rss, rss)
        if used is not None:
            self._used = max(self._used or 0, used)
        if proc is not None:
            self._proc_used = max(self._proc_used or 0, proc)
        self._samples += 1

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _open_nvml(self, cuda_index: int) -> None:
        nv, reason = nvml.init()
        if nv is None:
            self._notes.append(reason)
            return
        handle, note = nvml.device_handle(nv, cuda_index)
        if note:
            self._notes.append(note)
        if handle is None:
            return
        try:
            self._baseline, _ = nvml.read_memory(nv, handle)
        except nv.NVMLError as e:
            self._notes.append(f"NVML memory unavailable: {e.__class__.__name__}")
            return
        self._nv, self._handle = nv, handle

    def __enter__(self) -> "MemoryTracker":
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._open_nvml(torch.cuda.current_device())
        else:
            self._notes.append(f"NVML memory, energy and torch allocator peaks are CUDA-only (device={self.device})")
        self._sample()
        if self._nv is not None:
            self._energy_start_mj, note = nvml.read_energy_mj(self._nv, self._handle)
            if note:
                self._notes.append(note)
        self._t0 = perf_counter()
        self._thread = threading.Thread(target=self._loop, name="kvbench-memory", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()  # the run's GPU work is done, and in the energy read below
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.join_timeout_s)
            if self._thread.is_alive():
                self._notes.append(f"memory sampler still busy {self.join_timeout_s:g} s after the run "
                                   "(stuck NVML call?): NVML reads stopped there")
                self._nv = None
        energy_j = None
        if self._nv is not None and self._energy_start_mj is not None:
            end_mj, note = nvml.read_energy_mj(self._nv, self._handle)
            if end_mj is not None:
                energy_j, note = nvml.energy_between(self._energy_start_mj, end_mj)
            if note:
                self._notes.append(note)
        wall_s = perf_counter() - self._t0
        self._sample()
        alloc = reserved = None
        if self.device == "cuda":
            alloc, reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
        if self._failed:
            self._notes.append(f"memory sampler: {self._failed} of {self._failed + self._samples} samples failed "
                               f"(first: {self._first_error})")
        if self._handle is not None and self._proc_used is None:
            self._notes.append("NVML lists no memory for this process (container PID namespace?)")
        self.report = MemoryReport(
            nvml_used_bytes=self._used,
            nvml_process_bytes=self._proc_used,
            nvml_baseline_bytes=self._baseline,
            torch_allocated_bytes=alloc,
            torch_reserved_bytes=reserved,
            rss_bytes=self._rss,
            energy_j=energy_j,
            avg_power_w=energy_j / wall_s if energy_j is not None and wall_s > 0 else None,
            samples=self._samples,
            notes="; ".join(self._notes) or None,
        )
