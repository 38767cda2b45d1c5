"""NVML at the library boundary: the GPU torch uses, its memory and energy, or a reason they are absent.

Every call goes through ``pynvml``; without a driver (CPU machines) they return
None plus a reason, and the NVML columns stay empty.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any



def init() -> tuple[ModuleType | None, str | None]:
    """The pynvml module after nvmlInit, or None and why NVML is unavailable."""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return None, f"NVML unavailable: {e.__class__.__name__}"
    return pynvml, None


def driver_version() -> str | None:
    nv, _ = init()
    if nv is None:
        return None
    drv = nv.nvmlSystemGetDriverVersion()
    return drv.decode() if isinstance(drv, bytes) else drv


def _nvml_uuids(torch_uuid: str) -> list[str]:
    """NVML's spellings of a device UUID: torch prints it without NVML's 'GPU-' / 'MIG-' prefix.

    A bare UUID is tried as a whole GPU, then as a MIG instance (which CUDA also reports by UUID).
    """
    if torch_uuid.startswith(("GPU-", "MIG-")):
        return [torch_uuid]
    return [f"GPU-{torch_uuid}", f"MIG-{torch_uuid}"]


def device_handle(nv: ModuleType, cuda_index: int) -> tuple[Any | None, str | None]:
    """NVML's handle for torch's CUDA device ``cuda_index``, found by UUID, and a note (or None).

    The two number devices differently under CUDA_VISIBLE_DEVICES (torch counts the visible
    ones, NVML all of them), so an index is used only where UUID lookup is unavailable, and
    the note says so. No handle (None) when NVML does not know torch's UUID.
    """
    import torch  # lazily: the fingerprint's import must not load torch

    uuid = getattr(torch.cuda.get_device_properties(cuda_index), "uuid", None)
    by_uuid = getattr(nv, "nvmlDeviceGetHandleByUUID", None)
    if uuid is None:
        return _by_index(nv, cuda_index, "this torch gives no device UUID")
    if by_uuid is None:
        return _by_index(nv, cuda_index, "this nvidia-ml-py has no nvmlDeviceGetHandleByUUID")
    for candidate in _nvml_uuids(str(uuid)):
        try:
            return by_uuid(candidate), None
        except nv.NVMLError_NotFound:
            continue
        except nv.NVMLError_FunctionNotFound:
            return _by_index(nv, cuda_index, "the driver's NVML has no nvmlDeviceGetHandleByUUID")
        except nv.NVMLError as e:
            return None, f"NVML handle for GPU {uuid}: {e.__class__.__name__}"
    return None, f"NVML lists no GPU with torch's UUID {uuid}"


def _by_index(nv: ModuleType, index: int, why: str) -> tuple[Any | None, str]:
    note = f"NVML GPU chosen by index {index} ({why}): under CUDA_VISIBLE_DEVICES it may not be torch's"
    try:
        return nv.nvmlDeviceGetHandleByIndex(index), note
    except nv.NVMLError as e:
        return None, f"{note}; {e.__class__.__name__}"


def read_memory(nv: ModuleType, handle: Any, pid: int | None = None) -> tuple[int, int | None]:
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


def read_energy_mj(nv: ModuleType, handle: Any) -> tuple[int | None, str | None]:
    """The board's energy counter (mJ since the driver loaded, every process), or None and why.

    NVML documents it for Volta and newer; older boards answer NotSupported.
    """
    try:
        return int(nv.nvmlDeviceGetTotalEnergyConsumption(handle)), None
    except AttributeError:
        return None, "energy unavailable: this nvidia-ml-py has no nvmlDeviceGetTotalEnergyConsumption"
    except nv.NVMLError as e:
        return None, f"energy unavailable: {e.__class__.__name__}"


def energy_between(start_mj: int, end_mj: int) -> tuple[float | None, str | None]:
    """Joules between two reads of the energy counter, or None and why it is no measurement."""
    if end_mj < start_mj:
        return None, "energy dropped: NVML's counter went backwards (driver reloaded or counter reset)"
    if end_mj == start_mj:
        # A powered GPU always draws something: an unchanged counter was not updated in the run.
        return None, "energy dropped: NVML's counter did not advance (run shorter than its update period)"
    return (end_mj - start_mj) / 1e3, None


# NVML's clock-event (throttle) reason bits, by the names its headers give them.
THROTTLE_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def throttle_names(mask: int) -> str:
    """``sw_power_cap+hw_slowdown`` for the set bits (unknown bits as hex); ``none`` for 0."""
    names = [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
    rest = mask & ~sum(THROTTLE_REASONS)
    return "+".join(names + ([hex(rest)] if rest else [])) or "none"


def read_clocks(nv: ModuleType, handle: Any) -> tuple[int | None, str | None]:
    """The SM clock now (MHz) and why clocks are held below their maximum (``throttle_names``), each None if unreadable."""
    try:
        mhz = int(nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM))
    except (nv.NVMLError, AttributeError):
        mhz = None
    # nvidia-ml-py renamed the call (clocks "event reasons"); either name reads the same mask.
    read = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
    try:
        reasons = throttle_names(int(read(handle))) if read is not None else None
    except nv.NVMLError:
        reasons = None
    return mhz, reasons


def device_clocks(cuda_index: int) -> tuple[int | None, str | None]:
    """``read_clocks`` of the GPU torch calls ``cuda_index``; (None, None) without NVML."""
    nv, _ = init()
    if nv is None:
        return None, None
    handle, _ = device_handle(nv, cuda_index)
    return read_clocks(nv, handle) if handle is not None else (None, None)
