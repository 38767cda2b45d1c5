"""Peak memory bandwidth of the GPU, from NVML's memory clock and bus width."""

from __future__ import annotations

import torch

from harness.measure.nvml import _init


def peak_bandwidth_gbps(device: torch.device) -> float | None:
    """clock (MHz) x 2 (double data rate) x bus width (bytes); None on CPU or without NVML."""
    if device.type != "cuda":
        return None
    nv, _ = _init()
    if nv is None:
        return None
    try:
        h = nv.nvmlDeviceGetHandleByIndex(device.index or 0)
        clock_mhz = nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM)
        bus_bits = nv.nvmlDeviceGetMemoryBusWidth(h)
    except (nv.NVMLError, AttributeError):  # AttributeError: an nvidia-ml-py without these calls
        return None
    return clock_mhz * 1e6 * 2 * bus_bits / 8 / 1e9
