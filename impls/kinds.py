"""Cache kinds: each owns its sizing, its allocator, its tensors and its analytic concurrency.

A kind is chosen by an impl's ``cache`` key (and, for a contiguous cache, its
``reservation`` policy: impls/reservation.py); the harness hands it plain numbers
(``PoolSpec``) and never branches on the kind's name. A new kind is one class here
(or anywhere, registered in ``KINDS``) plus the impl YAML that names it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvbench.impls.allocator import KVAllocator
from kvbench.impls.block_manager import BlockManager
from kvbench.impls.attention_kinds import blocks_held
from kvbench.impls.group_pool import GroupedBlockPool, PoolGroup
from kvbench.impls.region_allocator import RegionAllocator
from kvbench.impls.reservation import RESERVATIONS
from kvbench.impls.sizing import CacheSizeError, blocks_for_tokens
from kvbench.impls.lane_allocator import LaneAllocator
from kvbench.kernels.registry import PAGED_KERNELS, SLAB_KERNELS, is_plugin

if TYPE_CHECKING:  # config validation reads the kinds without loading torch
    import torch

    from kvbench.impls.base import KVCache
    from kvbench.kernels.quant import KVScales


@dataclass(frozen=True)
class PoolSpec:
    """What sizing a KV pool needs, as plain numbers."""

    kv_bytes: int  # the budget for K and V
    bytes_per_token: int  # every layer's K and V of one token
    max_seq_len: int
    block_size: int
    max_num_seqs: int  # sequences that can run at once (batch x parallel samples)
    min_tokens: int  # the smallest pool still holds one request of this many tokens
    watermark: float  # paged: fraction of blocks kept back at admission
    prefix_caching: bool
    eviction: str = "lru"  # paged: which cached free block goes first (impls/eviction.py)
    host_kv_bytes: int = 0  # paged: the host tier (impls/host_tier.py); 0: none
    preemption: str = "recompute"  # paged: swap copies a victim's blocks to the host tier
    # paged, a model whose layers attend differently (harness/kv/groups.py): its groups, each pool's budget and
    # one layer's K/V of a token. No groups: one group of every layer (BlockManager), sized by bytes_per_token.
    groups: tuple[PoolGroup, ...] = ()
    pool_kv_bytes: tuple[int, ...] = ()
    layer_bytes: int = 0
    group_layers: tuple[tuple[int, ...], ...] = ()  # each group's model layers: what its tensors serve


@dataclass(frozen=True)
class TensorSpec:
    num_layers: int
    num_heads: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device
    kv_dtype: str = "auto"  # the store's format (kernels/kv_formats.py); auto: ``dtype``
    kv_scale: str = "tensor"
    scale: float | None = None  # attention's softmax scale (ModelConfig.softmax_scale); None: head_dim ** -0.5
    # MLA's latent (impls/base.py KVCache): kv_heads 1, head_dim kv_lora_rank + qk_rope_head_dim, V aliased to K
    latent: bool = False


@dataclass(frozen=True)
class KernelPool:
    """The kernel scenario's K/V (harness/scenarios/kernel.py): a block pool of random values, the
    batch's block tables in each layout, and every sequence's length (all ``context_len``)."""

    k_cache: torch.Tensor  # [num_blocks, block_size, kv_heads, head_dim]
    v_cache: torch.Tensor
    # layout -> [batch, blocks per sequence]: "paged" (shuffled blocks), "contiguous" (in order from block 0)
    tables: dict[str, torch.Tensor]
    context_lens: torch.Tensor  # [batch] int32
    context_len: int
    scales: KVScales | None = None  # a quantized pool's (kernels/quant.py)


@dataclass(frozen=True)
class DecodeInputs:
    """A batch's K/V as a decode kernel reads it (kernels/registry.py): the kernel's arguments."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor | None
    context_lens: torch.Tensor | None
    scales: KVScales | None = None

    def scale_kwargs(self) -> dict:
        """The kernel's ``scales=`` for a quantized pool; nothing for a float one."""
        return {} if self.scales is None else {"scales": self.scales}


class CacheKind(ABC):
    name: str
    gathers = False  # decode copies each sequence's K/V out before attending (named in kernel_backend)
    # Why the kernel scenario times no kernel for this kind (its skipped row); None: it times
    # the impl's kernel on each of ``kernel_layouts``.
    kernel_skip_reason: str | None = None

    # The built-in kernels (kernels/registry.py) that read this kind's layout.
    kernels: tuple[str, ...] = SLAB_KERNELS

    def kernel_error(self, kernel: str) -> str | None:
        """Why ``kernel`` (a built-in name or a module's dotted path) cannot attend over this kind; None: it can."""
        if kernel in self.kernels or (is_plugin(kernel) and self.kernels == PAGED_KERNELS):
            return None
        plugins = ", or a kernel module's dotted path" if self.kernels == PAGED_KERNELS else ""
        return f"a {self.name} cache attends with {', '.join(self.kernels)}{plugins}"

    @abstractmethod
    def pool_size(self, spec: PoolSpec) -> int:
        """Lanes, blocks or token slots the budget holds; ``CacheSizeError`` when not even one request fits."""

    @abstractmethod
    def allocator(self, spec: PoolSpec) -> KVAllocator: ...

    @abstractmethod
    def cache(self, spec: PoolSpec, tensors: TensorSpec, kernel: str) -> KVCache: ...

    @abstractmethod
    def max_concurrency(self, spec: PoolSpec, tokens_per_request: int) -> int:
        """Sequences of ``tokens_per_request`` tokens the budget holds at once (vLLM's start-up figure)."""

    @abstractmethod
    def unbounded_allocator(self, spec: PoolSpec, sequence_lens: list[int]) -> KVAllocator:
        """An allocator with room for every sequence of ``sequence_lens`` (final lengths) at once,
        whatever the budget: what serving them all concurrently reserves (the capacity points)."""

    def kernel_layouts(self, pool: KernelPool) -> dict[str, DecodeInputs]:
        """Per layout of ``pool`` (a key of ``pool.tables``), what this kind's decode kernel reads there."""
        raise NotImplementedError(f"cache kind {self.name!r} gives the kernel scenario no layout (kernel_layouts)")


class ContiguousKind(CacheKind):
    """A lane of ``max_seq_len`` tokens reserved per sequence."""

    name = "contiguous"

    def pool_size(self, spec: PoolSpec) -> int:
        lane_bytes = spec.max_seq_len * spec.bytes_per_token
        lanes = min(spec.max_num_seqs, spec.kv_bytes // lane_bytes)
        if lanes < 1:
            raise CacheSizeError(
                f"the KV budget ({spec.kv_bytes / 1e9:.3f} GB) holds no lane of max_seq_len="
                f"{spec.max_seq_len} tokens ({lane_bytes / 1e9:.3f} GB)"
            )
        return lanes

    def allocator(self, spec: PoolSpec) -> LaneAllocator:
        return LaneAllocator(self.pool_size(spec), spec.max_seq_len)

    def cache(self, spec: PoolSpec, tensors: TensorSpec, kernel: str) -> KVCache:
        from kvbench.impls.contiguous import ContiguousCache

        return ContiguousCache(self.allocator(spec), bytes_per_token=spec.bytes_per_token, **vars(tensors))

    def max_concurrency(self, spec: PoolSpec, tokens_per_request: int) -> int:
        return spec.kv_bytes // (spec.max_seq_len * spec.bytes_per_token)

    def unbounded_allocator(self, spec: PoolSpec, sequence_lens: list[int]) -> LaneAllocator:
        return LaneAllocator(len(sequence_lens), spec.max_seq_len)

    def kernel_layouts(self, pool: KernelPool) -> dict[str, DecodeInputs]:
        # The in-order blocks seen as a slab [batch, blocks x block_size, kv_heads, head_dim]: a view of
        # the pool, so the kernel (SDPA) reads the sequences' keys where they are, with no mask.
        table = pool.tables["contiguous"]
        batch, kv_shape = table.shape[0], pool.k_cache.shape[2:]
        k, v = (c[: table.numel()].reshape(batch, -1, *kv_shape)[:, : pool.context_len]
                for c in (pool.k_cache, pool.v_cache))
        scales = pool.scales
        if scales is not None and scales.dynamic:  # per-token scales seen as the same slab, [batch, L, kv_heads]
            ks, vs = (s[: table.numel()].reshape(batch, -1, kv_shape[0])[:, : pool.context_len]
                      for s in (scales.k, scales.v))
            scales = type(scales)(ks, vs, True)
        return {"contiguous": DecodeInputs(k, v, None, None, scales)}


class PagedKind(CacheKind):
    """Blocks of ``block_size`` slots handed out as tokens arrive (PagedAttention)."""

    name = "paged"
    kernels = PAGED_KERNELS

    def num_blocks(self, spec: PoolSpec) -> int:
        return spec.kv_bytes // (spec.block_size * spec.bytes_per_token)

    def pool_blocks(self, spec: PoolSpec) -> list[int]:
        """Grouped: blocks of each pool, a page spanning its groups' ``page_layers`` layers."""
        layers = {g.pool: g.page_layers for g in spec.groups}
        return [b // (spec.block_size * layers[p] * spec.layer_bytes) for p, b in enumerate(spec.pool_kv_bytes)]

    def _groups_per_pool(self, spec: PoolSpec) -> list[int]:
        count = [0] * len(spec.pool_kv_bytes)
        for g in spec.groups:
            count[g.pool] += 1
        return count

    def pool_size(self, spec: PoolSpec) -> int:
        if spec.groups:
            need = blocks_for_tokens(spec.min_tokens, spec.block_size)
            for p, (blocks, k) in enumerate(zip(self.pool_blocks(spec), self._groups_per_pool(spec))):
                if blocks < need * k:
                    raise CacheSizeError(
                        f"the KV budget's pool {p} ({spec.pool_kv_bytes[p] / 1e9:.3f} GB) holds {blocks} blocks of "
                        f"block_size={spec.block_size}, too few for even one request of {spec.min_tokens} tokens "
                        f"in its {k} group(s)")
            return sum(self.pool_blocks(spec))
        blocks = self.num_blocks(spec)
        if blocks * spec.block_size < spec.min_tokens:
            raise CacheSizeError(
                f"the KV budget ({spec.kv_bytes / 1e9:.3f} GB) holds {blocks} blocks of block_size="
                f"{spec.block_size}, too few for even one request of {spec.min_tokens} tokens"
            )
        return blocks

    def allocator(self, spec: PoolSpec) -> BlockManager | GroupedBlockPool:
        if spec.groups:
            self.pool_size(spec)
            return GroupedBlockPool(self.pool_blocks(spec), spec.block_size, spec.groups, spec.watermark,
                                    prefix_caching=spec.prefix_caching)
        blocks = self.pool_size(spec)
        return BlockManager(blocks, spec.block_size, prefix_caching=spec.prefix_caching,
                            watermark_blocks=int(spec.watermark * blocks), eviction=spec.eviction,
                            host_blocks=self.host_blocks(spec), swap=spec.preemption == "swap")

    def host_blocks(self, spec: PoolSpec) -> int:
        """Blocks the host tier holds (0: none); a tier too small for one block is an error, not none."""
        if not spec.host_kv_bytes:
            return 0
        blocks = spec.host_kv_bytes // (spec.block_size * spec.bytes_per_token)
        if blocks < 1:
            raise CacheSizeError(f"the host tier ({spec.host_kv_bytes / 1e9:.3g} GB) holds no block of "
                                 f"block_size={spec.block_size} ({spec.block_size * spec.bytes_per_token} bytes)")
        return blocks

    def cache(self, spec: PoolSpec, tensors: TensorSpec, kernel: str) -> KVCache:
        from kvbench.impls.paged import PagedCache
        from kvbench.kernels.registry import get_paged_kernel

        if spec.groups:  # a block table per group (impls/grouped_paged.py); its usage counts layer slots
            from kvbench.impls.grouped_paged import GroupedPagedCache

            pool = self.allocator(spec)
            return GroupedPagedCache(get_paged_kernel(kernel), pool, spec.group_layers,
                                     bytes_per_token=pool.usage_unit_layers * spec.layer_bytes, **vars(tensors))
        return PagedCache(get_paged_kernel(kernel), self.allocator(spec), bytes_per_token=spec.bytes_per_token,
                          **vars(tensors))

    def max_concurrency(self, spec: PoolSpec, tokens_per_request: int) -> int:
        if spec.groups:  # per pool: its blocks over what one sequence of that length holds in its groups
            held = [0] * len(spec.pool_kv_bytes)
            for g in spec.groups:
                held[g.pool] += blocks_held(g.kind, tokens_per_request, spec.block_size)
            return min(b // h for b, h in zip(self.pool_blocks(spec), held))
        return self.num_blocks(spec) // blocks_for_tokens(tokens_per_request, spec.block_size)

    def unbounded_allocator(self, spec: PoolSpec, sequence_lens: list[int]) -> BlockManager | GroupedBlockPool:
        # One block more per sequence than its final length needs: a copy-on-write of its last block.
        blocks = sum(blocks_for_tokens(n, spec.block_size) + 1 for n in sequence_lens)
        if spec.groups:  # as much in every group of every pool: what a prompt written in one chunk may take
            # Prefixes shared as the run's own pool would: hybrid's one pool only (harness/kv/groups.py).
            return GroupedBlockPool([blocks * k for k in self._groups_per_pool(spec)], spec.block_size, spec.groups,
                                    prefix_caching=spec.prefix_caching and len(spec.pool_kv_bytes) == 1)
        return BlockManager(blocks, spec.block_size, prefix_caching=spec.prefix_caching)

    def kernel_layouts(self, pool: KernelPool) -> dict[str, DecodeInputs]:
        # Shuffled blocks, as a pool fills; and the same kernel on in-order blocks, which is what
        # paging costs over a contiguous read.
        return {layout: DecodeInputs(pool.k_cache, pool.v_cache, table, pool.context_lens, pool.scales)
                for layout, table in pool.tables.items()}


class RegionKind(CacheKind):
    """One buffer of token slots; a contiguous region per sequence, sized by a reservation
    policy from its final length and placed first-fit (Orca (Pow2) and Orca (Oracle))."""

    name = "contiguous"
    gathers = True

    def __init__(self, reservation: str) -> None:
        self.reservation = reservation
        # A reservation policy changes memory, not the kernel: the contiguous impl's rows time SDPA.
        self.kernel_skip_reason = (f"impl.reservation={reservation}: a memory policy over the contiguous impl's "
                                   "SDPA; see the contiguous rows")

    def pool_size(self, spec: PoolSpec) -> int:
        tokens = spec.kv_bytes // spec.bytes_per_token
        if tokens < spec.min_tokens:
            raise CacheSizeError(
                f"the KV budget ({spec.kv_bytes / 1e9:.3f} GB) holds {tokens} token slots, too few for even "
                f"one request of {spec.min_tokens} tokens"
            )
        return tokens

    def allocator(self, spec: PoolSpec) -> RegionAllocator:
        return RegionAllocator(self.pool_size(spec), spec.max_seq_len, RESERVATIONS[self.reservation])

    def cache(self, spec: PoolSpec, tensors: TensorSpec, kernel: str) -> KVCache:
        from kvbench.impls.region_cache import RegionCache

        return RegionCache(self.allocator(spec), bytes_per_token=spec.bytes_per_token, **vars(tensors))

    def max_concurrency(self, spec: PoolSpec, tokens_per_request: int) -> int:
        # Token slots over the region a request of ``tokens_per_request`` reserves (holes ignored).
        reserved = RESERVATIONS[self.reservation](tokens_per_request, spec.max_seq_len)
        return spec.kv_bytes // spec.bytes_per_token // reserved

    def unbounded_allocator(self, spec: PoolSpec, sequence_lens: list[int]) -> RegionAllocator:
        slots = sum(RESERVATIONS[self.reservation](n, spec.max_seq_len) for n in sequence_lens)
        return RegionAllocator(slots, spec.max_seq_len, RESERVATIONS[self.reservation])


KINDS: dict[str, CacheKind] = {kind.name: kind for kind in (ContiguousKind(), PagedKind())}
# impl.reservation of a contiguous cache: ``max`` is the lane of max_seq_len per sequence.
CONTIGUOUS_RESERVATIONS: dict[str, CacheKind] = {
    "max": KINDS["contiguous"], "pow2": RegionKind("pow2"), "oracle": RegionKind("oracle"),
}


def cache_kind(name: str, reservation: str = "max") -> CacheKind:
    """The kind an impl's ``cache`` and ``reservation`` name; only a contiguous cache reserves other than max."""
    if name not in KINDS:
        raise KeyError(f"unknown cache kind {name!r}; allowed: {', '.join(KINDS)}")
    if reservation == "max":
        return KINDS[name]
    if name != ContiguousKind.name or reservation not in CONTIGUOUS_RESERVATIONS:
        raise KeyError(f"reservation {reservation!r} is not one of a {name} cache; allowed: "
                       f"{', '.join(CONTIGUOUS_RESERVATIONS) if name == ContiguousKind.name else 'max'}")
    return CONTIGUOUS_RESERVATIONS[reservation]
