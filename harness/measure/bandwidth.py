"""Peak memory bandwidth of the GPU, from NVML's memory clock and bus width."""

from __future__ import annotations

import torch

from kvbench.harness.measure import nvml


def peak_bandwidth_gbps(device: torch.device) -> float | None:
    """clock (MHz) x 2 (double data rate) x bus width (bytes); None on CPU or without NVML."""
    if device.type != "cuda":
        return None
    nv, _ = nvml.init()
    if nv is None:
        return None
    cuda_index = torch.cuda.current_device() if device.index is None else device.index
    # The handle's note (an index fallback) has no column here; a peak is a property of the
    # GPU model, which an index fallback gets right on any machine with one kind of GPU.
    h, _ = nvml.device_handle(nv, cuda_index)
    if h is None:
        return None
    try:
        clock_mhz = nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM)
        bus_bits = nv.nvmlDeviceGetMemoryBusWidth(h)
    except (nv.NVMLError, AttributeError):  # AttributeError: an nvidia-ml-py without these calls
        return None
    return clock_mhz * 1e6 * 2 * bus_bits / 8 / 1e9
