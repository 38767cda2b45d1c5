"""NVML readings that need no GPU: the throttle-reason mask named."""

from __future__ import annotations


def test_throttle_reasons_are_named():
    from kvbench.harness.measure.nvml import throttle_names

    assert throttle_names(0) == "none"
    assert throttle_names(0x4 | 0x40) == "sw_power_cap+hw_thermal_slowdown"
    assert throttle_names(0x1 | 0x10000) == "gpu_idle+0x10000"
