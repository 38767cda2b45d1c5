"""The paged KV cache: per-layer block pools, block tables, and a pluggable decode kernel.

Every paged impl (paged_torch, paged_triton, paged_cuda) is this class with a
different ``PagedKernel``; they share the ``BlockManager`` and the tensor layout
``[num_blocks, block_size, kv_heads, head_dim]`` (kernels/reference.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from impls.base import KVCache
from impls.block_manager import BlockManager
from impls.device_block_tables import DeviceBlockTables
from kernels.prefill import prefill_attention
from kernels.reference import gather_kv
from kernels.registry import PagedKernel


@dataclass
class _Prefill:
    slots: torch.Tensor  # int64 [T]
    table: torch.Tensor  # int32 [blocks]
    end: int


@dataclass
class _Decode:
    slots: torch.Tensor  # int64 [B]
    block_tables: torch.Tensor  # int32 [B, max_blocks]
    context_lens: torch.Tensor  # int32 [B]


class PagedCache(KVCache):
    allocator: BlockManager

    def __init__(self, kernel: PagedKernel, allocator: BlockManager, **tensor_args) -> None:
        super().__init__(allocator, allocator.num_blocks, allocator.block_size, **tensor_args)
        self.kernel = kernel
        self.tables = DeviceBlockTables(self.device)

    def prepare_prefill(self, seq_id: int, start: int, end: int) -> _Prefill:
        bm = self.allocator
        slots = torch.tensor(bm.rows(seq_id, start, end), dtype=torch.long, device=self.device)
        table = torch.tensor(bm.block_table(seq_id), dtype=torch.int32, device=self.device)
        return _Prefill(slots, table, end)

    def prepare_decode(self, seq_ids: Sequence[int]) -> _Decode:
        bm = self.allocator
        bs = bm.block_size
        tables = [bm.block_table(s) for s in seq_ids]
        lens = [bm.num_tokens(s) for s in seq_ids]
        slots = [t[(n - 1) // bs] * bs + (n - 1) % bs for t, n in zip(tables, lens)]
        return _Decode(
            torch.tensor(slots, dtype=torch.long, device=self.device),
            self.tables.gather(seq_ids, tables),
            torch.tensor(lens, dtype=torch.int32, device=self.device),
        )

    def forward_layer(self, layer, q, k, v, meta):
        k_pool, v_pool = self.k[layer], self.v[layer]
        self.kernel.write(k.contiguous(), v.contiguous(), k_pool, v_pool, meta.slots)
        if isinstance(meta, _Prefill):
            k_ctx = gather_kv(k_pool, meta.table, meta.end)
            v_ctx = gather_kv(v_pool, meta.table, meta.end)
            return prefill_attention(q, k_ctx, v_ctx, self.scale)
        return self.kernel.decode(q.contiguous(), k_pool, v_pool, meta.block_tables, meta.context_lens, self.scale)
