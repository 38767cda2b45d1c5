"""The grouped paged KV cache: tensors for a ``GroupedBlockPool`` (impls/group_pool.py), laid out as vLLM's
hybrid allocator lays them out (vllm/v1/worker/gpu_model_runner.py, its KV-cache tensors "shared_by" layers).

A pool of P pages whose page spans ``page_layers`` layers holds, per page layer j in 0..page_layers-1, a K and a
V tensor ``[P + 1, block_size, kv_heads, head_dim]`` (and a quantized store's per-token scales beside them). Model
layer l, the j-th layer of group g, reads and writes tensor j of g's pool through g's block table: the layers of
different groups share the tensors, each group its own pages of them (hybrid: one pool for every group;
split_pools: a pool per kind, each its own tensors and block ids). A padded group's missing layers leave their
page layers unused.

Blocks a sliding group dropped (``group_pool.NULL``, -1) are never handed to a kernel: every NULL becomes the
pool's null page, the extra page ``P`` that no sequence is ever given and nothing writes (zeros, as vLLM's null
block). A window masks it anyway, and it holds no garbage to leak through a mask (a torch kernel's ``0 * NaN``).
The device block tables start out on the null page too, so the entries past a short table of a batch read it.

Each step's metadata is PagedCache's, one per group; a layer's ``forward_*`` runs PagedCache's with its group's.
A state group (``LinearState``: Qwen3-Next's linear layers) writes no K/V: its pages hold each sequence's state,
which a layer reads and writes through ``linear_state`` (impls/state_pages.py); its metadata stages those pages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from kvbench.impls.allocator import SlotCopy
from kvbench.impls.base import KVCache, PrefillSpan, StateRows, apply_slot_copies, query_slices
from kvbench.impls.device_block_tables import DeviceBlockTables, StagedTables
from kvbench.impls.group_pool import NULL, GroupedBlockPool
from kvbench.impls.host_tier import HostCopies
from kvbench.impls.paged import PagedCache, _Decode, _Prefill, _PrefillSeq
from kvbench.impls.staging import StagingBuffer
from kvbench.impls.state_pages import StatePages, stage_states, state_pages, state_rows
from kvbench.kernels.quant import KVScales
from kvbench.kernels.registry import PagedKernel
from kvbench.kernels.validate import KernelArgumentError


@dataclass
class _GroupedPrefill:
    groups: list[_Prefill]  # PagedCache's metadata of each group (a state group's has no slots: no K/V written)
    states: StatePages | None = None  # the spans' state pages, where the pool has state groups


@dataclass
class _GroupedDecode:
    groups: list[_Decode]
    states: StatePages | None = None


class _NullMapped:
    """A block table as a kernel reads it: NULL entries as the pool's null page (only the slices read map)."""

    __slots__ = ("table", "null")

    def __init__(self, table: list[int], null: int) -> None:
        self.table, self.null = table, null

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, index: slice) -> list[int]:
        part = self.table[index]
        return [self.null if b == NULL else b for b in part] if NULL in part else part


class _GroupTables(DeviceBlockTables):
    """One group's device block tables: padded with its pool's null page, updated by difference.

    The pool reports no changes, so they are worked out here from what changes a table between two steps:
    tokens appended (new entries at its end), a copy-on-write of its last block, and blocks dropped from its
    front as they leave a window (those entries become the null page). A new table object (an admission, a
    fork, a re-admission after a preemption) is written whole.
    """

    def __init__(self, device: torch.device, null: int) -> None:
        super().__init__(device)
        self.null = null
        self.buf.fill_(null)
        self._seen: dict[int, tuple[list[int], int, int]] = {}  # seq -> (its table, its leading NULLs, its length)

    def _grow(self, rows: int, cols: int) -> None:
        old_rows, old_cols = self.buf.shape
        super()._grow(rows, cols)
        self.buf[old_rows:].fill_(self.null)
        self.buf[:old_rows, old_cols:].fill_(self.null)

    def stage_group(self, seq_ids: Sequence[int], tables: Sequence[list[int]], dropped: Sequence[int],
                    staging: StagingBuffer) -> StagedTables:
        """Queue the edits of the batch's rows (``dropped``: each table's leading NULL entries)."""
        changes: dict[int, int] = {}
        seen: dict[int, tuple[list[int], int, int]] = {}
        for sid, table, d in zip(seq_ids, tables, dropped):
            before = self._seen.get(sid)
            if before is None or before[0] is not table:
                changes[sid] = 0
            else:  # the last entry on (a copy-on-write replaces it), and the entries dropped since
                changes[sid] = max(before[2] - 1, 0) if d == before[1] else min(before[1], max(before[2] - 1, 0))
            seen[sid] = (table, d, len(table))
        self._seen = seen  # holds the tables it saw: a new table is never mistaken for a freed one's address
        return self.stage(seq_ids, [_NullMapped(t, self.null) for t in tables], changes, staging)


def _first_held(table: list[int], hint: int) -> int:
    """Leading NULL entries of ``table`` (``hint``: the pool's count, checked, else counted)."""
    n = len(table)
    if (hint == n or (hint < n and table[hint] != NULL)) and (hint == 0 or table[hint - 1] == NULL):
        return hint
    return next((i for i, b in enumerate(table) if b != NULL), n)


class GroupedPagedCache(PagedCache):
    """A paged cache with a block table per group (kv_manager hybrid or split_pools); any paged kernel.

    Its ``bytes_per_token`` is the bytes of one unit of the pool's usage, a layer slot (impls/group_pool.py): what
    the engine's memory columns multiply (harness/kv/factory.py usage_unit_bytes), so they count every group."""

    allocator: GroupedBlockPool

    def __init__(self, kernel: PagedKernel, allocator: GroupedBlockPool, group_layers: Sequence[Sequence[int]],
                 *, num_layers: int, kv_heads: int, head_dim: int, device: torch.device, kv_dtype: str = "auto",
                 kv_scale: str = "tensor", **tensor_args) -> None:
        groups = allocator.groups
        layers = sorted(layer for ls in group_layers for layer in ls)
        if len(group_layers) != len(groups) or layers != list(range(num_layers)) or any(
                len(ls) != g.layers for ls, g in zip(group_layers, groups)):
            raise ValueError(f"group_layers must give each of the pool's {len(groups)} groups its "
                             f"{[g.layers for g in groups]} layers, every layer of {num_layers} once; "
                             f"got {[list(ls) for ls in group_layers]}")
        # The base's stores of 0 blocks (nothing allocated): its per-layer lists (windows, calibration) stay sized.
        KVCache.__init__(self, allocator, 0, allocator.block_size, num_layers=num_layers, kv_heads=kv_heads,
                         head_dim=head_dim, device=device, kv_dtype=kv_dtype, kv_scale=kv_scale, **tensor_args)
        refusal = kernel.kv_dtype_error(self.kv_dtype)
        if refusal is not None:
            raise KernelArgumentError(refusal)
        self.kernel = kernel
        allocator.padded_decode_read = kernel.padded_read
        self.host_buffers = []  # no host tier
        self.group_of = [0] * num_layers
        for g, ls in enumerate(group_layers):
            for layer in ls:
                self.group_of[layer] = g
        self._allocate(group_layers, kv_heads, head_dim, kv_scale)
        self.windows = [getattr(groups[g].kind, "window", None) or 0 for g in self.group_of]
        self.tables_of = [_GroupTables(self.device, allocator.pools[g.pool].num_blocks) for g in groups]
        # Groups whose pages hold a linear-attention state, not K/V per token (impls/state_pages.py).
        self.state_groups = [g for g, group in enumerate(groups) if group.kind.state_tokens is not None]

    def _allocate(self, group_layers: Sequence[Sequence[int]], kv_heads: int, head_dim: int, kv_scale: str) -> None:
        """Each pool's page-layer tensors, with the null page; every layer's stores are views of its page layer's."""
        bs = self.allocator.block_size
        dynamic = self.scales is not None and self.scales[0].dynamic
        store = self.k[0].dtype if self.k else self.dtype
        self.pool_stores: list[list[torch.Tensor]] = []  # per pool, every block store (what a copy copies)
        pages = []
        for p in self.allocator.pools:
            shape = (p.num_blocks + 1, bs, kv_heads, head_dim)
            k = [torch.zeros(shape, dtype=store, device=self.device) for _ in range(p.page_layers)]
            # MLA's latent: the V stores are the K stores (impls/base.py KVCache), allocated and copied once
            v = list(k) if self.latent else [torch.zeros(shape, dtype=store, device=self.device)
                                             for _ in range(p.page_layers)]
            # Per-token scales live with their page's rows; a static scale is each layer's own (the base's).
            scales = [KVScales.allocate(kv_scale, shape, self.device) for _ in range(p.page_layers)] if dynamic else []
            if self.latent:
                scales = [KVScales(sc.k, sc.k, True) for sc in scales]
            pages.append((k, v, scales))
            own = (t for sc in scales for t in ((sc.k,) if self.latent else (sc.k, sc.v)))
            self.pool_stores.append([*k, *([] if self.latent else v), *own])
        for group, ls in zip(self.allocator.groups, group_layers):
            k, v, scales = pages[group.pool]
            for j, layer in enumerate(ls):
                self.k[layer], self.v[layer] = k[j], v[j]
                if dynamic:
                    self.scales[layer] = scales[j]

    def set_layer_windows(self, windows: Sequence[int]) -> None:
        """As the base's; a layer of a sliding group must slide within its group's window (its blocks are freed)."""
        before = self.windows
        super().set_layer_windows(windows)
        for layer, (w, g) in enumerate(zip(windows, self.group_of)):
            kind_window = getattr(self.allocator.groups[g].kind, "window", None)
            if kind_window is not None and not 0 < w <= kind_window:
                self.windows = before
                raise ValueError(f"layer {layer} is in a group of sliding window {kind_window}, whose blocks leave as "
                                 f"the window passes: its window must be in [1, {kind_window}], got {w}")

    def counters(self) -> dict[str, int]:
        return {}

    def copy_host(self, copies: HostCopies) -> None:
        KVCache.copy_host(self, copies)  # no host tier

    def block_stores(self) -> list[torch.Tensor]:
        return [s for stores in self.pool_stores for s in stores]

    def copy_slots(self, copies: Sequence[SlotCopy]) -> None:
        """A copy-on-write within one pool: a copy's blocks are its pool's (``pool``, where there are several)."""
        if not copies:
            return
        by_pool: dict[int, list[SlotCopy]] = {}
        for c in copies:
            pool = getattr(c, "pool", None)
            if pool is None:
                if len(self.pool_stores) > 1:
                    raise NotImplementedError("a copy-on-write under kv_manager=split_pools names no pool: its block "
                                              "ids are ambiguous across the pools' tensors")
                pool = 0
            by_pool.setdefault(pool, []).append(c)
        for pool, cs in by_pool.items():
            apply_slot_copies(self.pool_stores[pool], cs)

    # ---- a step's metadata: PagedCache's, per group ------------------------------------------------------
    def _tables(self, seq_id: int) -> tuple[list[list[int]], list[int]]:
        """The sequence's block table in each group and each one's leading NULL entries."""
        pool = self.allocator
        tables = pool.tables[seq_id]
        return tables, [_first_held(t, d) for t, d in zip(tables, pool.dropped[seq_id])]

    def prepare_prefill(self, spans: Sequence[PrefillSpan], staging: StagingBuffer | None = None) -> _GroupedPrefill:
        pool = self.allocator
        staging = staging or StagingBuffer(self.device)
        planned = []
        for g, group in enumerate(pool.groups):
            null = pool.pools[group.pool].num_blocks
            slots = staging.add([] if g in self.state_groups else
                                [slot for s in spans for slot in pool.group_slots(s.seq_id, g, s.start, s.end)])
            tables = []
            for s in spans:
                table = pool.tables[s.seq_id][g]
                tables.append(staging.add(_NullMapped(table, null)[:], torch.int32))
            planned.append((slots, tables))
        staged = stage_states([pool.tables[s.seq_id] for s in spans], self.state_groups,
                              [s.num_tokens for s in spans], [s.start == 0 for s in spans], staging)
        staging.upload()
        queries = query_slices(spans)
        return _GroupedPrefill([
            _Prefill(staging[slots], [_PrefillSeq(q, staging[t], s.end) for s, q, t in zip(spans, queries, tables)])
            for slots, tables in planned], state_pages(staged, staging))

    def prepare_decode(self, seq_ids: Sequence[int], staging: StagingBuffer | None = None) -> _GroupedDecode:
        pool, bs = self.allocator, self.allocator.block_size
        staging = staging or StagingBuffer(self.device)
        lens = [pool.num_tokens(s) for s in seq_ids]
        context_lens = staging.add(lens, torch.int32)
        held = [self._tables(s) for s in seq_ids]
        planned = []
        for g in range(len(pool.groups)):
            tables = [t[g] for t, _ in held]
            slots = staging.add([] if g in self.state_groups else
                                [t[(n - 1) // bs] * bs + (n - 1) % bs for t, n in zip(tables, lens)])
            planned.append((slots, self.tables_of[g].stage_group(seq_ids, tables, [d[g] for _, d in held], staging)))
        states = stage_states([t for t, _ in held], self.state_groups, [1] * len(seq_ids), [False] * len(seq_ids),
                              staging)
        staging.upload()
        return _GroupedDecode([
            _Decode(staging[slots], self.tables_of[g].apply(staged, staging), staging[context_lens], max(lens))
            for g, (slots, staged) in enumerate(planned)], state_pages(states, staging))

    # ---- a linear-attention layer's state: its sequences' state pages (impls/state_pages.py) -------------------
    def linear_state(self, layer: int, meta: _GroupedPrefill | _GroupedDecode) -> StateRows:
        g = self.group_of[layer]
        if meta.states is None or g not in meta.states.pages:
            kind = self.allocator.groups[g].kind.label
            raise ValueError(f"layer {layer} is in a {kind} group, which keeps no linear-attention state")
        if self.scales is not None:
            raise ValueError(f"kv_dtype={self.kv_dtype} quantizes the pool, and a linear-attention state is kept at "
                             "the model's dtype; allowed: kv_dtype=auto for a model with linear_attention layers")
        return state_rows(self.k[layer], self.v[layer], meta.states, g)

    # ---- attention: PagedCache's, with the layer's group's metadata -------------------------------------------
    def forward_prefill(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        meta: _GroupedPrefill) -> torch.Tensor:
        return super().forward_prefill(layer, q, k, v, meta.groups[self.group_of[layer]])

    def forward_decode(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       meta: _GroupedDecode) -> torch.Tensor:
        return super().forward_decode(layer, q, k, v, meta.groups[self.group_of[layer]])
