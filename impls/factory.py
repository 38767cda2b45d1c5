"""Build an impl's allocator (bookkeeping only) or its full cache from the config."""

from __future__ import annotations

import torch

from harness.config import Config, ImplConfig
from harness.errors import ConfigError
from harness.metrics import max_concurrency_contiguous, max_concurrency_paged
from harness.kv_math import TORCH_DTYPES, kv_bytes_per_token
from impls.base import KVAllocator, KVCache
from impls.block_manager import BlockManager
from impls.slot_allocator import SlotAllocator


def pool_size(impl: ImplConfig, cfg: Config, kv_bytes: int) -> int:
    """Slots (contiguous) or blocks (paged) that ``kv_bytes`` holds; errors if not one request."""
    bpt = kv_bytes_per_token(cfg.model, cfg.dtype)
    if impl.cache == "contiguous":
        slots = min(cfg.batch * cfg.workload.n, kv_bytes // (cfg.max_seq_len * bpt))
        if slots < 1:
            raise ConfigError(
                f"the KV budget ({kv_bytes / 1e9:.3f} GB) holds no contiguous slot of max_seq_len={cfg.max_seq_len} "
                f"tokens ({cfg.max_seq_len * bpt / 1e9:.3f} GB); raise device.memory_gb or lower max_seq_len"
            )
        return slots
    blocks = kv_bytes // (cfg.block_size * bpt)
    if blocks * cfg.block_size < cfg.workload.prompt_len + 1:
        raise ConfigError(
            f"the KV budget ({kv_bytes / 1e9:.3f} GB) holds {blocks} blocks of block_size={cfg.block_size}, "
            f"too few for even one request of workload.prompt_len={cfg.workload.prompt_len}; raise device.memory_gb"
        )
    return blocks


def analytic_max_concurrency(impl: ImplConfig, cfg: Config, kv_bytes: int, tokens_per_request: int) -> int:
    """Sequences of ``tokens_per_request`` tokens the budget holds at once, not capped by batch."""
    bpt = kv_bytes_per_token(cfg.model, cfg.dtype)
    if impl.cache == "contiguous":
        return max_concurrency_contiguous(kv_bytes, cfg.max_seq_len, bpt)
    return max_concurrency_paged(kv_bytes // (cfg.block_size * bpt), cfg.block_size, tokens_per_request)


def watermark_blocks(cfg: Config, num_blocks: int) -> int:
    return int(cfg.device.watermark * num_blocks)


def build_allocator(impl: ImplConfig, cfg: Config, kv_bytes: int) -> KVAllocator:
    size = pool_size(impl, cfg, kv_bytes)
    if impl.cache == "contiguous":
        return SlotAllocator(size, cfg.max_seq_len)
    return BlockManager(size, cfg.block_size, prefix_caching=impl.prefix_caching,
                        watermark_blocks=watermark_blocks(cfg, size))


def build_cache(impl: ImplConfig, cfg: Config, kv_bytes: int, device: torch.device) -> KVCache:
    m = cfg.model
    allocator = build_allocator(impl, cfg, kv_bytes)
    common = dict(num_layers=m.num_layers, num_heads=m.num_heads, kv_heads=m.num_kv_heads, head_dim=m.head_dim,
                  dtype=TORCH_DTYPES[cfg.dtype], device=device,
                  bytes_per_token=kv_bytes_per_token(m, cfg.dtype))
    if impl.cache == "contiguous":
        from impls.contiguous import ContiguousCache

        return ContiguousCache(allocator, **common)
    from impls.paged import PagedCache
    from kernels.registry import get_paged_kernel

    return PagedCache(get_paged_kernel(impl.kernel), allocator, **common)
