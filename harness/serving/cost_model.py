"""The simulated clock: what one scheduler step costs on a named GPU (a roofline per step).

Every input is a plain number; conf/gpu/*.yaml gives them per GPU, each with its source.
Symbols (bytes, seconds, FLOP):

    n     GPUs working on one model (tensor parallel: ``count``)
    bw    memory bandwidth per GPU, bytes/s       eb  its efficiency, in (0, 1]
    F     dense bf16/fp16 peak per GPU, FLOP/s    ef  its efficiency, in (0, 1]
    o     fixed overhead of a step (host scheduling, launches), s
    W     weight bytes    P  parameters    kvb  KV bytes per token (every layer, K and V)
    L     layers          h  hidden size   e    bytes per activation element
    link  interconnect bandwidth per GPU and direction, bytes/s;  lat  latency of one collective, s

Tensor parallelism splits the weights, the KV heads and the FLOPs evenly over the n GPUs:
each moves W/n + KV/n bytes and does 1/n of the FLOPs, so the model sees n*bw*eb bytes/s
and n*F*ef FLOP/s. Each layer then all-reduces its attention output and its MLP output
(Megatron-style): 2*L ring all-reduces of m = tokens*h*e bytes, each lat + 2*(n-1)/n * m / link.

    comm(T)        = 0 if n == 1, else 2*L * (lat + 2*(n-1)/n * T*h*e / link)
    decode_s(B, R) = o + max((W + R*kvb) / (n*bw*eb),  2*P*B / (n*F*ef)) + comm(B)
        B sequences make one token each; R = KV tokens the step's attention reads
        (every sequence's context, its new token included).
    prefill_s(T)   = o + max(2*P*T / (n*F*ef),  W / (n*bw*eb)) + comm(T)
        T prompt tokens computed (prefix-cache hits are not).
    decode_s(B, R, k) = sum over j = 0..k-1 of decode_s(B, R + j*B)
        k steps of an unchanged batch, each reading B more KV tokens than the one before:
        the memory term grows linearly in j, so the first j* steps are compute-bound and
        the sum has a closed form (``_decode_sum``).

Left out on purpose: attention FLOPs (2*P per token counts the matmuls; decode at these
context lengths is memory-bound), KV writes and activation traffic, sampling, and any
overlap of communication with compute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from harness.config import Config, GpuConfig
from harness.errors import ConfigError
from harness.kv.sizes import DTYPE_BYTES, kv_bytes_per_token, parameter_count, weight_bytes
from harness.model.config import ModelConfig

# Figures that divide or scale the cost: 0 or below has no meaning.
_POSITIVE = ("memory_gb", "bandwidth_gbps", "tflops", "bw_efficiency", "flops_efficiency", "interconnect_gbps")
# Added times: 0 is a valid idealisation (no overhead, no latency).
_NON_NEGATIVE = ("step_overhead_us", "interconnect_latency_us")


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model's figures (datasheet, plus modelling assumptions), and how many work together."""

    name: str
    memory_gb: float  # per GPU, GB = 1e9 bytes
    bandwidth_gbps: float  # memory bandwidth per GPU, GB/s (or a measured copy bandwidth)
    tflops: float  # dense bf16/fp16 tensor-core peak per GPU, TFLOP/s
    bw_efficiency: float  # fraction of bandwidth a decode step reaches
    flops_efficiency: float  # fraction of peak a prefill's matmuls reach
    step_overhead_us: float  # fixed cost of every step
    interconnect_gbps: float  # GPU-to-GPU bandwidth per GPU and direction, GB/s
    interconnect_latency_us: float  # per collective
    count: int = 1  # tensor-parallel GPUs

    def __post_init__(self) -> None:
        for key in _POSITIVE:
            if not getattr(self, key) > 0:
                raise ConfigError(f"gpu.{key}={getattr(self, key)} must be > 0 (gpu={self.name})")
        for key in _NON_NEGATIVE:
            if not getattr(self, key) >= 0:
                raise ConfigError(f"gpu.{key}={getattr(self, key)} must be >= 0 (gpu={self.name})")
        for key in ("bw_efficiency", "flops_efficiency"):
            if getattr(self, key) > 1:
                raise ConfigError(f"gpu.{key}={getattr(self, key)} must be in (0, 1] (gpu={self.name})")
        if self.count < 1:
            raise ConfigError(f"gpu.count={self.count} must be >= 1 (gpu={self.name})")

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


@dataclass(frozen=True)
class ModelCost:
    """What the clock needs of a model (harness/kv/sizes.py computes these from its shape)."""

    params: int
    weight_bytes: int
    kv_bytes_per_token: int
    num_layers: int
    hidden_size: int
    elem_bytes: int  # activations' dtype


@dataclass(frozen=True)
class CostModel:
    """Prices the scheduler's steps: ``prefill_s(tokens)`` and ``decode_s(batch, kv_tokens_read, steps)``."""

    gpu: GpuSpec
    model: ModelCost

    @property
    def bytes_per_s(self) -> float:  # n*bw*eb
        g = self.gpu
        return g.count * g.bandwidth_gbps * 1e9 * g.bw_efficiency

    @property
    def flops_per_s(self) -> float:  # n*F*ef
        g = self.gpu
        return g.count * g.tflops * 1e12 * g.flops_efficiency

    @property
    def overhead_s(self) -> float:  # o
        return self.gpu.step_overhead_us * 1e-6

    def comm_s(self, tokens: int) -> float:
        """2*L ring all-reduces of tokens*h*e bytes; none on one GPU."""
        g, m = self.gpu, self.model
        if g.count == 1:
            return 0.0
        message = tokens * m.hidden_size * m.elem_bytes
        ring = 2 * (g.count - 1) / g.count * message / (g.interconnect_gbps * 1e9)
        return 2 * m.num_layers * (g.interconnect_latency_us * 1e-6 + ring)

    def prefill_s(self, tokens: int) -> float:
        m = self.model
        compute = 2 * m.params * tokens / self.flops_per_s
        weights = m.weight_bytes / self.bytes_per_s
        return self.overhead_s + max(compute, weights) + self.comm_s(tokens)

    def decode_s(self, batch: int, kv_tokens_read: int, steps: int = 1) -> float:
        """``steps`` decode steps of ``batch`` sequences; the first reads ``kv_tokens_read`` KV tokens,
        each later one ``batch`` more."""
        if steps < 1:
            raise ValueError(f"steps={steps} must be >= 1")
        m = self.model
        fixed = self.overhead_s + self.comm_s(batch)
        first = (m.weight_bytes + kv_tokens_read * m.kv_bytes_per_token) / self.bytes_per_s  # memory term, step 0
        growth = batch * m.kv_bytes_per_token / self.bytes_per_s  # memory term added per step
        compute = 2 * m.params * batch / self.flops_per_s
        return steps * fixed + _decode_sum(first, growth, compute, steps)


def _decode_sum(a: float, d: float, c: float, k: int) -> float:
    """sum over j = 0..k-1 of max(a + j*d, c), with d >= 0.

    The first j* terms, those with a + j*d < c, are c; the rest an arithmetic series:
    j* = 0 if a >= c, k if d == 0, else min(k, ceil((c - a) / d)).
    """
    if a >= c:
        j = 0
    elif d == 0:
        j = k
    else:
        j = min(k, math.ceil((c - a) / d))
    series = (k - j) * a + d * (k * (k - 1) - j * (j - 1)) / 2  # sum of a + i*d for i = j..k-1
    return j * c + series


def model_cost(model: ModelConfig, dtype: str, kv_dtype: str = "auto", kv_scale: str = "tensor") -> ModelCost:
    """A model config's figures for ``dtype``, its KV cache stored as ``kv_dtype`` (harness/kv/sizes.py)."""
    return ModelCost(params=parameter_count(model), weight_bytes=weight_bytes(model, dtype),
                     kv_bytes_per_token=kv_bytes_per_token(model, dtype, kv_dtype, kv_scale),
                     num_layers=model.num_layers,
                     hidden_size=model.hidden_size, elem_bytes=DTYPE_BYTES[dtype])


def gpu_spec(gpu: GpuConfig) -> GpuSpec:
    """A resolved ``GpuConfig`` (harness/config.py: every figure filled) as a validated spec."""
    return GpuSpec(**{key: getattr(gpu, key) for key in GpuSpec.field_names()})


def cost_model_for(cfg: Config) -> CostModel:
    """The clock of a resolved ``Config`` whose ``gpu`` is set."""
    if cfg.gpu is None:
        raise ConfigError("the simulated clock needs a GPU: gpu=NAME (conf/gpu/)")
    return CostModel(gpu_spec(cfg.gpu), model_cost(cfg.model, cfg.dtype, cfg.kv_dtype, cfg.kv_scale))
