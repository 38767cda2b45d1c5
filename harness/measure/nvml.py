"""NVML at the library boundary: device and per-process memory, or a reason it is absent.

Every call goes through ``pynvml``; without a driver (CPU machines) they return
None plus a reason, and the NVML columns stay empty.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class NvmlInfo:
    driver_version: str
    total_bytes: int


def _init():
    """The pynvml module after nvmlInit, or the reason it is unavailable."""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return None, f"NVML unavailable: {e.__class__.__name__}"
    return pynvml, None


def nvml_unavailable_reason() -> str | None:
    nv, reason = _init()
    return reason


def nvml_device_info(index: int = 0) -> NvmlInfo | None:
    nv, _ = _init()
    if nv is None:
        return None
    h = nv.nvmlDeviceGetHandleByIndex(index)
    drv = nv.nvmlSystemGetDriverVersion()
    return NvmlInfo(drv.decode() if isinstance(drv, bytes) else drv, int(nv.nvmlDeviceGetMemoryInfo(h).total))


def read_memory(nv, handle, pid: int | None = None) -> tuple[int, int | None]:
    """(device used bytes, this process's used bytes or None if NVML does not list it)."""
    used = int(nv.nvmlDeviceGetMemoryInfo(handle).used)
    pid = os.getpid() if pid is None else pid
    proc = None
    try:
        for p in nv.nvmlDeviceGetComputeRunningProcesses(handle):
            if p.pid == pid and p.usedGpuMemory is not None:
                proc = int(p.usedGpuMemory)
    except nv.NVMLError:
        proc = None
    return used, proc
