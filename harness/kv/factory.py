"""The glue from the config to a cache kind (impls/kinds.py): plain numbers in, allocators and caches out."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import psutil

from kvbench.harness.kv.budget import (
    HOST_BYTES_PER_TOKEN, HOST_CHECK_MIN_BYTES, HOST_WEIGHTS_RAM_FRACTION, check_host_pool, raise_budget_advice,
    simulated, workload_host_bytes,
)
from kvbench.harness.config import Config, ImplConfig
from kvbench.harness.errors import ConfigError
from kvbench.harness.kv.sizes import DTYPE_BYTES, GB, kv_bytes_per_token, torch_dtype
from kvbench.harness.model.config import ModelConfig
from kvbench.impls.allocator import KVAllocator
from kvbench.impls.kinds import PoolSpec, TensorSpec, cache_kind
from kvbench.impls.sizing import CacheSizeError
from kvbench.kernels.kv_formats import is_quantized

if TYPE_CHECKING:  # allocators are plain Python: a bookkeeping run (scenario=capacity) never loads torch
    import torch

    from kvbench.impls.base import KVCache


def grouped_layout(cfg: Config, kv_bytes: int) -> dict:
    """PoolSpec's grouped fields under ``cfg.kv_manager`` (harness/kv/groups.py); none for a model whose layers
    all attend alike (one group under every manager: the BlockManager, today's rows)."""
    from kvbench.harness.kv.groups import has_one_kind, kv_groups, layer_bytes_per_token, split_pool_bytes
    from kvbench.impls.group_pool import PoolGroup

    if has_one_kind(cfg.model) or cfg.kv_manager == "uniform":
        return {}
    groups = kv_groups(cfg.model, cfg.kv_manager)
    layer = layer_bytes_per_token(cfg.model, cfg.dtype, cfg.kv_dtype, cfg.kv_scale)
    pools = (split_pool_bytes(groups, kv_bytes, cfg.swa_full_tokens_ratio, layer)
             if cfg.kv_manager == "split_pools" else [kv_bytes])
    return {"groups": tuple(PoolGroup(g.kind, g.num_layers, g.page_layers, g.pool) for g in groups),
            "pool_kv_bytes": tuple(pools), "layer_bytes": layer, "group_layers": tuple(g.layers for g in groups)}


def kv_manager_of(cfg: Config, impl: ImplConfig | None) -> str:
    """The manager ``impl``'s cache really applies (a row's ``kv_manager``): ``cfg.kv_manager``, but uniform for a
    contiguous (or Orca) cache of a model of several attention kinds, which has no groups and caches every layer as
    full attention (its windows only mask). A model of one kind keeps ``cfg.kv_manager``: the same rows as before."""
    from kvbench.harness.kv.groups import has_one_kind

    if impl is None or impl.cache == "paged" or has_one_kind(cfg.model):
        return cfg.kv_manager
    return "uniform"


def usage_unit_bytes(allocator: KVAllocator, cfg: Config) -> int:
    """Bytes of one unit of ``allocator.usage()``: a token of every layer, or a grouped pool's layer slot."""
    from kvbench.harness.kv.groups import layer_bytes_per_token

    layers = getattr(allocator, "usage_unit_layers", None)
    if layers is None:
        return kv_bytes_per_token(cfg.model, cfg.dtype, cfg.kv_dtype, cfg.kv_scale)
    return layers * layer_bytes_per_token(cfg.model, cfg.dtype, cfg.kv_dtype, cfg.kv_scale)


def pool_spec(impl: ImplConfig | None, cfg: Config, kv_bytes: int) -> PoolSpec:
    """The budget and the config's shape as a kind reads them; ``impl`` None: no prefix caching."""
    layout = grouped_layout(cfg, kv_bytes) if impl is None or impl.cache == "paged" else {}
    prefix_caching = impl.prefix_caching if impl is not None else False
    if layout and prefix_caching:  # hybrid's one pool caches prefixes across its groups; split_pools refuses
        from kvbench.harness.kv.groups import PREFIX_CACHING_MANAGERS, prefix_caching_refusal

        if cfg.kv_manager not in PREFIX_CACHING_MANAGERS:
            raise ConfigError(prefix_caching_refusal(cfg.kv_manager, cfg.model.name))
    return PoolSpec(
        kv_bytes=kv_bytes,
        bytes_per_token=kv_bytes_per_token(cfg.model, cfg.dtype, cfg.kv_dtype, cfg.kv_scale),
        max_seq_len=cfg.max_seq_len,
        block_size=cfg.block_size,
        max_num_seqs=cfg.batch * cfg.workload.n,
        min_tokens=math.ceil(cfg.workload.prompt_len) + 1,  # prompt_len is a mean, maybe fractional
        watermark=cfg.device.watermark,
        prefix_caching=prefix_caching,
        eviction=impl.eviction if impl is not None else "lru",
        host_kv_bytes=int((cfg.device.host_kv_gb or 0) * 1e9),  # GB = 1e9 bytes, as every budget
        preemption=cfg.preemption,
        **layout,
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


def cache_tensors(model: ModelConfig, dtype: str, device: torch.device | str, kv_dtype: str = "auto",
                  kv_scale: str = "tensor") -> TensorSpec:
    """The tensors a cache allocates for ``model``: K and V of every kv head, or an MLA model's latent as one kv
    head of ``kv_lora_rank + qk_rope_head_dim`` values stored once (``latent``: V aliases K, impls/base.py;
    harness/model/deepseek.py attends through it), at the model's softmax scale."""
    import torch

    from kvbench.harness.kv.latent import is_latent, latent_values_per_token
    from kvbench.harness.model.config import softmax_scale

    latent = is_latent(model)
    return TensorSpec(num_layers=model.num_layers, num_heads=model.num_heads,
                      kv_heads=1 if latent else model.num_kv_heads,
                      head_dim=latent_values_per_token(model) if latent else model.head_dim,
                      dtype=torch_dtype(dtype), device=torch.device(device), kv_dtype=kv_dtype, kv_scale=kv_scale,
                      scale=softmax_scale(model), latent=latent)


def build_cache(impl: ImplConfig, cfg: Config, kv_bytes: int, device: torch.device) -> KVCache:
    import torch

    from kvbench.impls.base import layer_windows

    free = psutil.virtual_memory().available
    in_ram = torch.device(device).type == "cpu"
    if in_ram:  # the pool is allocated in RAM: never most of it
        check_host_pool(kv_bytes, free)
    if impl.cache == "paged":  # its host tier is allocated in RAM too (pinned on a GPU), after the pool
        check_host_tier_ram(cfg, free, kv_bytes if in_ram else 0)
    m = cfg.model
    tensors = cache_tensors(m, cfg.dtype, device, cfg.kv_dtype, cfg.kv_scale)
    cache = _sized(impl, cfg, kv_bytes, lambda kind, spec: kind.cache(spec, tensors, impl.kernel))
    windows = layer_windows(m.layer_types, m.sliding_window)
    if windows is not None:  # a sliding layer's kernels read only its window (every block kept under uniform)
        cache.set_layer_windows(windows)
    return cache


# ---- host memory: the host tier, and the blocks' bookkeeping ---------------------------------------------
# The paged pool's bookkeeping is plain Python (impls/block_manager.py, impls/host_tier.py), measured as the
# RSS growth over 4M blocks of block_size=16 (CPython 3.11): a device block costs 72 bytes as the pool is
# built, whatever the run does (its ref, filled, hash and tokens lists, the free deque). A host slot costs
# nothing until a block is stored in it (impls/host_tier.py hands out never used slots lazily; a list of
# every slot took 40 bytes a slot: 12 GB for a simulated 20 TB tier of tiny-llama); a stored block's entry
# (an OrderedDict entry, its (tokens, slot) pair and hash) took 277 bytes at block_size=1 and 390 at 16:
# 280 plus the tokens tuple's 8 bytes a token. A tier stores at most the blocks the workload fills.
DEVICE_BLOCK_BYTES = 72
HOST_ENTRY_BYTES = 280
HOST_ENTRY_BYTES_PER_TOKEN = 8
# workload.kind=system_prompt draws every system prompt up front: measured 221 bytes a prompt of 16 tokens,
# 2134 of 256 (1M and 200k prompts): 96 plus the list's 8 a token (HOST_BYTES_PER_TOKEN's 16 covers it).
SYSTEM_PROMPT_BYTES = 96
# A host tier that really allocates (the wall clock: tensors in RAM, pinned on a GPU) may take at most this
# share of the RAM available; above HOST_TIER_NOTE_FRACTION a row says so (the rest of the run shares the rest).
HOST_TIER_RAM_FRACTION = 0.8
HOST_TIER_NOTE_FRACTION = 0.5


def block_bytes(cfg: Config) -> int:
    """One block of the KV cache, every layer's K and V (and their scales), as the pool and the host tier hold it."""
    return cfg.block_size * kv_bytes_per_token(cfg.model, cfg.dtype, cfg.kv_dtype, cfg.kv_scale)


def _gb_down(nbytes: float) -> str:
    """``nbytes`` in GB, rounded down to 4 significant digits: a range's top that is itself allowed."""
    gb = nbytes / GB
    if gb <= 0:
        return "0"
    exp = math.floor(math.log10(gb)) - 3
    return f"{math.floor(gb / 10**exp) * 10**exp:.{max(0, -exp)}f}".rstrip("0").rstrip(".")


def _smallest_host_gb(one_block: int) -> float:
    """The smallest ``device.host_kv_gb`` of three significant digits that holds a block (``pool_spec``'s int())."""
    gb = float(f"{one_block / GB:.2e}")
    while int(gb * GB) < one_block:
        gb = float(f"{gb * 1.01:.2e}")
    return gb


def host_tier_blocks(cfg: Config) -> int:
    """Blocks the host tier holds (0: none), as impls/kinds.py sizes it; a tier smaller than one block is an error."""
    host_bytes = int((cfg.device.host_kv_gb or 0) * GB)
    if not host_bytes:
        return 0
    one = block_bytes(cfg)
    if host_bytes < one:
        raise ConfigError(
            f"device.host_kv_gb={cfg.device.host_kv_gb:g} holds less than one block ({one} bytes a block: "
            f"block_size={cfg.block_size} x {one // cfg.block_size} bytes per token); the smallest useful value is "
            f"{_smallest_host_gb(one):g} (or 0: no host tier)")
    return host_bytes // one


def _paged(cfg: Config) -> bool:
    """The run builds a paged pool (impl absent: every impl runs, the paged ones among them)."""
    return cfg.impl is None or cfg.impl.cache == "paged"


def _largest_pool_bytes(cfg: Config, gpu_total_bytes: int | None) -> int:
    """An upper bound of the KV pool's size: what ``kv_budget`` starts from, before the weights take their part."""
    if cfg.device.kv_cache_gb is not None:
        return int(cfg.device.kv_cache_gb * GB)
    device = cfg.device.memory_gb * GB if cfg.device.memory_gb is not None else gpu_total_bytes or 0
    return int(device * cfg.device.utilization)


def _workload_blocks(cfg: Config) -> int:
    """Full blocks the workload's tokens fill: the most a host tier can be asked to keep."""
    w = cfg.workload
    tokens = min(cfg.max_seq_len, math.ceil(w.prompt_len) + w.n * math.ceil(w.output_len))
    return (w.num_requests or cfg.batch) * max(1, tokens // cfg.block_size)


def check_host_tier_ram(cfg: Config, free_ram_bytes: int, beside: int = 0) -> None:
    """A host tier that really allocates (wall clock), with ``beside`` bytes of the pool in RAM too: refused above
    ``HOST_TIER_RAM_FRACTION`` of the free RAM, with the key's allowed range, instead of an oom row from the allocator."""
    tier = host_tier_blocks(cfg)
    if not tier or simulated(cfg):
        return
    limit = int(free_ram_bytes * HOST_TIER_RAM_FRACTION) - beside
    if tier * block_bytes(cfg) <= limit:
        return
    pool = f", beside a KV pool of {beside / GB:.2f} GB in RAM" if beside else ""
    raise ConfigError(
        f"device.host_kv_gb={cfg.device.host_kv_gb:g} is allocated in {'pinned ' * (cfg.device.name == 'cuda')}host RAM "
        "and may take at most "
        f"{HOST_TIER_RAM_FRACTION:.0%} of the {free_ram_bytes / GB:.2f} GB available{pool}; allowed: "
        f"device.host_kv_gb in [{_smallest_host_gb(block_bytes(cfg)):g}, {_gb_down(limit)}] (or 0: no host tier)")


def host_tier_note(cfg: Config, free_ram_bytes: int) -> str | None:
    """A row's note when a host tier that really allocates takes most of the RAM available (the run shares the rest)."""
    tier = host_tier_blocks(cfg)
    share = tier * block_bytes(cfg) / free_ram_bytes if free_ram_bytes > 0 else 0.0
    if simulated(cfg) or share <= HOST_TIER_NOTE_FRACTION:
        return None
    return (f"the host tier (device.host_kv_gb={cfg.device.host_kv_gb:g}) takes {share:.0%} of the "
            f"{free_ram_bytes / GB:.2f} GB of RAM available at its start")


@dataclass(frozen=True)
class _HostPart:
    """Host memory that grows with one key: how much, and the key's allowed range for ``room`` bytes."""

    what: str  # the key, its value, and what it makes
    nbytes: int
    allowed: Callable[[int], str]


def _host_parts(cfg: Config, gpu_total_bytes: int | None) -> list[_HostPart]:
    """What the run keeps in host memory beyond ``workload_host_bytes``, each part under the key it grows with."""
    parts, w = [], cfg.workload
    one = block_bytes(cfg)
    if _paged(cfg):
        blocks = _largest_pool_bytes(cfg, gpu_total_bytes) // one
        groups = grouped_layout(cfg, 0).get("groups", ())
        if groups:  # a grouped pool's pages span a group's layers: more, smaller blocks (impls/group_pool.py)
            one = min(one, cfg.block_size * min(g.page_layers for g in groups)
                      * (block_bytes(cfg) // cfg.block_size // cfg.model.num_layers))
            blocks = _largest_pool_bytes(cfg, gpu_total_bytes) // one
        if cfg.device.kv_cache_gb is not None:
            key, value, scale = "device.kv_cache_gb", cfg.device.kv_cache_gb, 1.0
        else:  # unset on a GPU: the pool is sized from the GPU's memory
            value = cfg.device.memory_gb if cfg.device.memory_gb is not None else (gpu_total_bytes or 0) / GB
            key, scale = "device.memory_gb", 1 / cfg.device.utilization
        parts.append(_HostPart(
            f"{key}={value:g} makes a KV pool of up to {blocks:,} blocks of {one} bytes (block_size={cfg.block_size}), "
            "whose bookkeeping", blocks * DEVICE_BLOCK_BYTES,
            lambda room: f"{key} up to {_gb_down(room // DEVICE_BLOCK_BYTES * one * scale)}, or a larger block_size"))
        tier = host_tier_blocks(cfg)
        entry = HOST_ENTRY_BYTES + HOST_ENTRY_BYTES_PER_TOKEN * cfg.block_size
        if tier:
            parts.append(_HostPart(
                f"device.host_kv_gb={cfg.device.host_kv_gb:g} makes a host tier of {tier:,} blocks, whose bookkeeping",
                min(tier, _workload_blocks(cfg)) * entry,
                lambda room: f"device.host_kv_gb in [{_smallest_host_gb(one):g}, {_gb_down(room // entry * one)}]"))
    if w.kind == "system_prompt":  # drawn up front, each a list of its tokens
        each = SYSTEM_PROMPT_BYTES + HOST_BYTES_PER_TOKEN * w.system_prompt_len
        parts.append(_HostPart(
            f"workload.system_prompts={w.system_prompts} of workload.system_prompt_len={w.system_prompt_len} tokens",
            w.system_prompts * each, lambda room: f"workload.system_prompts in [1, {max(1, room // each)}]"))
    extra = w.shared_prefix_len + 1 - math.ceil(w.prompt_len)  # every prompt holds the shared prefix and a token
    if w.kind == "plain" and extra > 0:
        requests = w.num_requests or cfg.batch
        parts.append(_HostPart(
            f"workload.shared_prefix_len={w.shared_prefix_len}, in each of {requests} prompts,",
            requests * extra * HOST_BYTES_PER_TOKEN,
            lambda room: f"workload.shared_prefix_len in [0, "
                         f"{room // (requests * HOST_BYTES_PER_TOKEN) + math.ceil(w.prompt_len) - 1}]"))
    return parts


def check_host_memory(cfg: Config, free_ram_bytes: int, gpu_total_bytes: int | None = None) -> None:
    """Refuse, before anything is built, a size whose host memory the RAM cannot hold, naming its key and range.

    On the wall clock the host tier is tensors (``check_host_tier_ram``). Every run keeps the paged pool's
    bookkeeping in plain Python (``DEVICE_BLOCK_BYTES`` a device block, ``HOST_ENTRY_BYTES`` a stored host
    block): a simulated box (scenario=capacity) may legitimately have a host tier of terabytes, so its bound
    is what that bookkeeping takes. The workload's system prompts and a shared prefix longer than its prompts
    are drawn up front. All of it, beside the workload's requests (``workload_host_bytes``), must fit within
    ``HOST_WEIGHTS_RAM_FRACTION`` of the RAM available.
    """
    check_host_tier_ram(cfg, free_ram_bytes)
    parts = _host_parts(cfg, gpu_total_bytes)
    total = sum(p.nbytes for p in parts)
    room = int(free_ram_bytes * HOST_WEIGHTS_RAM_FRACTION) - workload_host_bytes(cfg)
    if total <= max(room, HOST_CHECK_MIN_BYTES):
        return
    part = max(parts, key=lambda p: p.nbytes)
    left = max(0, room - (total - part.nbytes))  # what the workload and the other parts leave it
    raise ConfigError(
        f"{part.what} takes about {part.nbytes / GB:.2f} GB of host memory, more than the {left / GB:.2f} GB left "
        f"for it of {HOST_WEIGHTS_RAM_FRACTION:.0%} of the {free_ram_bytes / GB:.2f} GB available; allowed: "
        f"{part.allowed(left)}")


def kernel_pool_bytes(cfg: Config) -> int:
    """The peak of scenario=kernel's K/V (harness/scenarios/kernel.py ``_inputs``): one layer's blocks for ``batch``
    sequences of ``scenario.context_len`` tokens, each tensor drawn in float32 and then cast, a quantized copy beside."""
    m, bs = cfg.model, cfg.block_size
    elements = 2 * (cfg.batch * -(-cfg.scenario.context_len // bs) + 1) * bs * m.num_kv_heads * m.head_dim
    return elements * (DTYPE_BYTES[cfg.dtype] + is_quantized(cfg.kv_dtype)) + elements // 2 * 4


def check_kernel_pool(cfg: Config, free_ram_bytes: int, gpu_total_bytes: int | None) -> None:
    """scenario=kernel's K/V within the GPU's memory, or ``HOST_WEIGHTS_RAM_FRACTION`` of the RAM available (CPU)."""
    if gpu_total_bytes is None and cfg.device.name == "cuda":
        return  # a GPU job checked where no GPU is (a sweep's dry check on CPU): its GPU bounds it where it runs
    need = kernel_pool_bytes(cfg)
    if gpu_total_bytes is not None:
        limit, what = gpu_total_bytes, f"the GPU's {gpu_total_bytes / GB:.2f} GB"
    else:
        limit = int(free_ram_bytes * HOST_WEIGHTS_RAM_FRACTION)
        what = f"{HOST_WEIGHTS_RAM_FRACTION:.0%} of the {free_ram_bytes / GB:.2f} GB of RAM available"
    if need <= limit:
        return
    per_block = need / (cfg.batch * -(-cfg.scenario.context_len // cfg.block_size) + 1)
    most = max(0, int(limit / per_block) - 1) // cfg.batch * cfg.block_size
    raise ConfigError(
        f"scenario.context_len={cfg.scenario.context_len} x batch={cfg.batch} makes a kernel pool of {need / GB:.2f} GB "
        f"(one layer's K and V in dtype={cfg.dtype}, with the float32 draw), more than {what}; allowed: "
        f"scenario.context_len in [1, {most}] at batch={cfg.batch}" + ("" if most else ", or a smaller batch"))
