"""How much memory the KV cache may take, as vLLM sizes it.

GPU: (total memory x utilization, or the ``device.memory_gb`` cap) minus the
weights and the measured activation peak. CPU and the capacity scenario: the
simulated device ``device.memory_gb`` x utilization minus the weights and an
activation estimate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from harness.config import Config
from harness.errors import ConfigError
from harness.kv_math import GB, activation_bytes_estimate, weight_bytes


@dataclass(frozen=True)
class MemoryBudget:
    device_bytes: int  # the device, or the simulated / capped size
    usable_bytes: int  # device_bytes x utilization
    weight_bytes: int
    activation_bytes: int
    kv_bytes: int  # what is left for the KV cache
    source: str  # where device_bytes came from

    def as_row(self) -> dict[str, int | str]:
        return {f"budget_{k}": v for k, v in asdict(self).items()}


def forward_tokens_bound(cfg: Config, prompt_lens: Sequence[int] | None = None) -> int:
    """Tokens of the largest single forward the engine runs (what vLLM profiles).

    A prefill step computes at most ``max_num_batched_tokens`` tokens, or one prompt that
    is longer (admitted alone); a decode step one token per running sequence. With the
    workload's prompt lengths known the bound is tighter: no step computes more prompt
    tokens than the workload has.
    """
    decode = cfg.batch * cfg.workload.n
    if not prompt_lens:
        return max(cfg.max_num_batched_tokens, cfg.max_seq_len, decode)
    return max(min(cfg.max_num_batched_tokens, sum(prompt_lens)), max(prompt_lens), decode)


def logits_rows_bound(cfg: Config) -> int:
    """Logits rows one forward keeps: one per running sequence (decode) or admitted one (prefill)."""
    return cfg.batch * cfg.workload.n


def kv_budget(
    cfg: Config,
    device_total_bytes: int | None = None,
    measured_weight_bytes: int | None = None,
    measured_activation_bytes: int | None = None,
    prompt_lens: Sequence[int] | None = None,
) -> MemoryBudget:
    if cfg.device.memory_gb is not None:
        device_bytes = int(cfg.device.memory_gb * GB)
        source = "device.memory_gb"
        if device_total_bytes is not None and device_bytes > device_total_bytes:
            device_bytes, source = device_total_bytes, "device total (device.memory_gb above it)"
    elif device_total_bytes is not None:
        device_bytes, source = device_total_bytes, "device total"
    else:
        raise ConfigError("device.memory_gb must be set when the device size cannot be read")
    usable = int(device_bytes * cfg.device.utilization)
    weights = measured_weight_bytes if measured_weight_bytes is not None else weight_bytes(cfg.model, cfg.dtype)
    act = (measured_activation_bytes if measured_activation_bytes is not None
           else activation_bytes_estimate(cfg.model, cfg.dtype, forward_tokens_bound(cfg, prompt_lens),
                                          logits_rows_bound(cfg)))
    kv = usable - weights - act
    if cfg.device.kv_cache_gb is not None:
        return MemoryBudget(device_bytes, usable, weights, act, int(cfg.device.kv_cache_gb * GB), "device.kv_cache_gb")
    if kv <= 0:
        gpu = f"gpu={cfg.gpu.name} x gpu.count={cfg.gpu.count}: " if cfg.gpu is not None else ""
        raise ConfigError(
            f"{gpu}device.memory_gb={device_bytes / GB:.2f} GB x device.utilization={cfg.device.utilization} "
            f"= {usable / GB:.2f} GB leaves nothing for the KV cache: weights need {weights / GB:.2f} GB "
            f"and activations {act / GB:.2f} GB (model={cfg.model.name}, dtype={cfg.dtype})"
        )
    return MemoryBudget(device_bytes, usable, weights, act, kv, source)
