"""One GPU model's figures as the simulated clock reads them (harness/serving/cost_model.py), validated.

conf/gpu/*.yaml gives the figures, each with its source; harness/config.py's ``GpuConfig`` carries them resolved.
Version 9's FLOP efficiency by a step's work, ``ef(g)``, is a property of the card's GEMMs, so it lives here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

from kvbench.harness.config import GpuConfig
from kvbench.harness.errors import ConfigError
from kvbench.harness.kv.sizes import MIB

# Figures that divide or scale the cost: 0 or below has no meaning.
_POSITIVE = ("memory_mib", "bandwidth_gbps", "tflops", "bw_efficiency", "flops_efficiency", "interconnect_gbps",
             "attn_bw_efficiency")
# Added times: 0 is a valid idealisation (no overhead, no latency).
_NON_NEGATIVE = ("interconnect_latency_us", "host_link_latency_us")
_FRACTIONS = ("bw_efficiency", "flops_efficiency", "attn_bw_efficiency")
# The smallest message an ``allreduce_by_count`` row was fitted on (conf/gpu/: NCCL at 1-32 MiB).
ALLREDUCE_FIT_FROM = 2**20


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model's figures (datasheet, measurements, modelling assumptions), and how many work together.

    The figures after ``count`` have neutral defaults (a prefill floor of one weight read, attention at the
    weights' rate, no copy measurement) for hand-built specs; conf/gpu/*.yaml sets every one of them."""

    name: str
    memory_mib: float  # per GPU, MiB = 2**20 bytes: the total the driver reports (``memory_bytes``)
    bandwidth_gbps: float  # datasheet memory bandwidth per GPU, GB/s
    tflops: float  # dense bf16/fp16 tensor-core peak per GPU, TFLOP/s
    bw_efficiency: float  # fraction of bandwidth_gbps a stream reaches, where no copy bandwidth is measured
    flops_efficiency: float  # fraction of peak a prefill's matmuls reach
    interconnect_gbps: float  # GPU-to-GPU bandwidth per GPU and direction, GB/s
    interconnect_latency_us: float  # per collective
    count: int = 1  # tensor-parallel GPUs
    copy_bandwidth_gbps: float | None = None  # measured device-to-device copy (read + write), GB/s; None: unknown
    attn_bw_efficiency: float = 1.0  # fraction of the achievable bandwidth decode attention reaches
    host_link_gbps: float | None = None  # host <-> device per GPU and direction, GB/s; None: unknown
    host_link_latency_us: float = 0.0  # fixed cost of one host <-> device transfer
    fp8_tflops: float | None = None  # dense fp8 tensor peak per GPU, TFLOP/s; None: no fp8 tensor cores
    flops_efficiency_small: float | None = None  # ef0: a small step's; None: flops_efficiency at every size
    flops_ramp_gflop: float | None = None  # g0: a layer's GFLOP on one GPU at which ef(g) is half-way to the top
    fp8_flops_efficiency: float | None = None  # ef at fp8_tflops, at every size; None: flops_efficiency
    # (count, latency_us, busbw_gbps): the all-reduce measured on ``count`` GPUs; other counts: interconnect_*
    allreduce_by_count: tuple[tuple[int, float, float], ...] = ()

    def __post_init__(self) -> None:
        for key in _POSITIVE:
            if not getattr(self, key) > 0:
                raise ConfigError(f"gpu.{key}={getattr(self, key)} must be > 0 (gpu={self.name})")
        for key in _NON_NEGATIVE:
            if not getattr(self, key) >= 0:
                raise ConfigError(f"gpu.{key}={getattr(self, key)} must be >= 0 (gpu={self.name})")
        for key in _FRACTIONS:
            if getattr(self, key) > 1:
                raise ConfigError(f"gpu.{key}={getattr(self, key)} must be in (0, 1] (gpu={self.name})")
        if self.copy_bandwidth_gbps is not None and not self.copy_bandwidth_gbps > 0:
            raise ConfigError(f"gpu.copy_bandwidth_gbps={self.copy_bandwidth_gbps} must be > 0, or null where "
                              f"none is measured (gpu={self.name})")
        if self.fp8_tflops is not None and not self.fp8_tflops > 0:
            raise ConfigError(f"gpu.fp8_tflops={self.fp8_tflops} must be > 0, or null where the GPU has no fp8 "
                              f"tensor cores (gpu={self.name})")
        if self.host_link_gbps is not None and not self.host_link_gbps > 0:
            raise ConfigError(f"gpu.host_link_gbps={self.host_link_gbps} must be > 0, or null where none is known "
                              f"(gpu={self.name})")
        if self.count < 1:
            raise ConfigError(f"gpu.count={self.count} must be >= 1 (gpu={self.name})")
        if self.fp8_flops_efficiency is not None and not 0 < self.fp8_flops_efficiency <= 1:
            raise ConfigError(f"gpu.fp8_flops_efficiency={self.fp8_flops_efficiency} must be in (0, 1], or null for "
                              f"flops_efficiency (gpu={self.name})")
        _check_allreduce(self.allreduce_by_count, self.name)
        small, ramp = self.flops_efficiency_small, self.flops_ramp_gflop
        if (small is None) != (ramp is None) or (small is not None and not (0 < small <= self.flops_efficiency
                                                                              and ramp > 0)):
            raise ConfigError(f"gpu.flops_efficiency_small={small}, gpu.flops_ramp_gflop={ramp} (gpu={self.name}): "
                              f"both null (one efficiency at every size), or 0 < flops_efficiency_small <= "
                              f"flops_efficiency={self.flops_efficiency} and flops_ramp_gflop > 0")

    def flops_efficiency_at(self, layer_gflop: float) -> float:
        """ef(g): the fraction of the dense peak a step's matmuls reach, ``layer_gflop`` a layer's on one GPU."""
        if self.flops_efficiency_small is None:
            return self.flops_efficiency
        top, ramp = self.flops_efficiency, self.flops_ramp_gflop
        return top - (top - self.flops_efficiency_small) * ramp / (layer_gflop + ramp)

    def allreduce_s(self, message_bytes: float) -> float:
        """One ring all-reduce of ``message_bytes`` on ``count`` GPUs: latency + 2(n-1)/n x bytes / busbw. A measured
        row was fitted from ``ALLREDUCE_FIT_FROM`` up, where its latency is NCCL's protocols' intercept (19-36 us), not
        a small message's: below it the time runs linearly from interconnect_latency_us (an empty message; 10 us
        on NVLink, under CUDA graphs) to the row's at ``ALLREDUCE_FIT_FROM``."""
        latency_us, busbw_gbps = self.allreduce()
        ring = 2 * (self.count - 1) / self.count

        def fitted(size: float) -> float:
            return latency_us * 1e-6 + ring * size / (busbw_gbps * 1e9)

        if self._measured_row() is None or message_bytes >= ALLREDUCE_FIT_FROM:
            return fitted(message_bytes)
        empty = self.interconnect_latency_us * 1e-6
        return empty + (fitted(ALLREDUCE_FIT_FROM) - empty) * message_bytes / ALLREDUCE_FIT_FROM

    def allreduce(self) -> tuple[float, float]:
        """(latency us, bus bandwidth GB/s) of one all-reduce on ``count`` GPUs: the measured row for that count,
        else interconnect_latency_us and interconnect_gbps."""
        row = self._measured_row()
        return (row[1], row[2]) if row is not None else (self.interconnect_latency_us, self.interconnect_gbps)

    def _measured_row(self) -> tuple[int, float, float] | None:
        return next((row for row in self.allreduce_by_count if row[0] == self.count), None)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @property
    def memory_bytes(self) -> int:  # per GPU
        return round(self.memory_mib * MIB)

    @property
    def achievable_gbps(self) -> float:  # A, per GPU
        if self.copy_bandwidth_gbps is not None:
            return self.copy_bandwidth_gbps
        return self.bandwidth_gbps * self.bw_efficiency


def _check_allreduce(rows, name: str) -> None:
    for row in rows:
        numbers = isinstance(row, Sequence) and not isinstance(row, str) and len(row) == 3 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in row)
        if not numbers or not float(row[0]).is_integer() or row[0] < 2 or not row[1] >= 0 or not row[2] > 0:
            shown = list(row) if isinstance(row, Sequence) and not isinstance(row, str) else row
            raise ConfigError(f"gpu.allreduce_by_count: {shown} (gpu={name}): each row is [count, latency_us, "
                              "busbw_gbps], count an integer >= 2, latency_us >= 0, busbw_gbps > 0")
    counts = [row[0] for row in rows]
    if len(set(counts)) != len(counts):
        raise ConfigError(f"gpu.allreduce_by_count lists a GPU count twice: {counts} (gpu={name})")


def gpu_spec(gpu: GpuConfig) -> GpuSpec:
    """A resolved ``GpuConfig`` (harness/config.py: every figure filled) as a validated spec."""
    figures = {key: getattr(gpu, key) for key in GpuSpec.field_names()}
    optional = ("copy_bandwidth_gbps", "host_link_gbps", "host_link_latency_us", "fp8_tflops",  # None: unknown
                "flops_efficiency_small", "flops_ramp_gflop", "fp8_flops_efficiency", "allreduce_by_count")
    unset = [key for key, value in figures.items() if value is None and key not in optional]
    if unset:  # a GPU file of its own that predates a figure: name what it lacks
        raise ConfigError(f"gpu={gpu.name}: {', '.join(f'gpu.{k}' for k in unset)} not set; conf/gpu/{gpu.name}.yaml "
                          f"(or the command line) must give each (copy_bandwidth_gbps may be null)")
    if figures["host_link_latency_us"] is None:
        del figures["host_link_latency_us"]
    figures["allreduce_by_count"] = tuple(tuple(row) for row in figures["allreduce_by_count"] or ())  # checked in the spec
    return GpuSpec(**figures)
