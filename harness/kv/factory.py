"""The glue from the config to a cache kind (impls/kinds.py): plain numbers in, allocators and caches out."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import psutil

from harness.kv.budget import check_host_pool, raise_budget_advice
from harness.config import Config, ImplConfig
from harness.errors import ConfigError
from harness.kv.sizes import kv_bytes_per_token, torch_dtype
from impls.allocator import KVAllocator
from impls.kinds import PoolSpec, TensorSpec, cache_kind
from impls.sizing import CacheSizeError

if TYPE_CHECKING:  # allocators are plain Python: a bookkeeping run (scenario=capacity) never loads torch
    import torch

    from impls.base import KVCache


def pool_spec(impl: ImplConfig | None, cfg: Config, kv_bytes: int) -> PoolSpec:
    """The budget and the config's shape as a kind reads them; ``impl`` None: no prefix caching."""
    return PoolSpec(
        kv_bytes=kv_bytes,
        bytes_per_token=kv_bytes_per_token(cfg.model, cfg.dtype, cfg.kv_dtype, cfg.kv_scale),
        max_seq_len=cfg.max_seq_len,
        block_size=cfg.block_size,
        max_num_seqs=cfg.batch * cfg.workload.n,
        min_tokens=math.ceil(cfg.workload.prompt_len) + 1,  # prompt_len is a mean, maybe fractional
        watermark=cfg.device.watermark,
        prefix_caching=impl.prefix_caching if impl is not None else False,
        eviction=impl.eviction if impl is not None else "lru",
        host_kv_bytes=int((cfg.device.host_kv_gb or 0) * 1e9),  # GB = 1e9 bytes, as every budget
        preemption=cfg.preemption,
    )


def _sized(impl: ImplConfig, cfg: Config, kv_bytes: int, make):
    """Run ``make(kind, spec)``; a budget too small for one request is a config error naming the keys."""
    try:
        return make(cache_kind(impl.cache, impl.reservation), pool_spec(impl, cfg, kv_bytes))
    except CacheSizeError as e:
        raise ConfigError(f"{e}; {raise_budget_advice(cfg)} or lower max_seq_len") from e


def analytic_max_concurrency(impl: ImplConfig, cfg: Config, kv_bytes: int, tokens_per_request: int) -> int:
    """Sequences of ``tokens_per_request`` tokens the budget holds at once, not capped by batch."""
    kind = cache_kind(impl.cache, impl.reservation)
    return kind.max_concurrency(pool_spec(impl, cfg, kv_bytes), tokens_per_request)


def build_allocator(impl: ImplConfig, cfg: Config, kv_bytes: int) -> KVAllocator:
    return _sized(impl, cfg, kv_bytes, lambda kind, spec: kind.allocator(spec))


def build_cache(impl: ImplConfig, cfg: Config, kv_bytes: int, device: torch.device) -> KVCache:
    import torch

    if torch.device(device).type == "cpu":  # the pool is allocated in RAM: never most of it
        check_host_pool(kv_bytes, psutil.virtual_memory().available)
    m = cfg.model
    tensors = TensorSpec(num_layers=m.num_layers, num_heads=m.num_heads, kv_heads=m.num_kv_heads,
                         head_dim=m.head_dim, dtype=torch_dtype(cfg.dtype), device=torch.device(device),
                         kv_dtype=cfg.kv_dtype, kv_scale=cfg.kv_scale)
    return _sized(impl, cfg, kv_bytes, lambda kind, spec: kind.cache(spec, tensors, impl.kernel))
