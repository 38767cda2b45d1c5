"""The paged KV cache: per-layer block pools, block tables, and a pluggable decode kernel.

Every paged impl (paged_torch, paged_triton, paged_cuda) is this class with a
different ``PagedKernel``; they share the ``BlockManager`` and the tensor layout
``[num_blocks, block_size, kv_heads, head_dim]`` (kernels/reference.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from kvbench.impls.base import KVCache, PrefillSpan, query_slices
from kvbench.impls.host_tier import HostCopies
from kvbench.impls.block_manager import BlockManager
from kvbench.impls.device_block_tables import DeviceBlockTables
from kvbench.impls.staging import StagingBuffer
from kvbench.kernels.prefill import prefill_attention
from kvbench.kernels.reference import gather_kv
from kvbench.kernels.registry import PagedKernel
from kvbench.kernels.validate import KernelArgumentError
from kvbench.impls.sizing import blocks_for_tokens


@dataclass
class _PrefillSeq:
    queries: slice  # this sequence's rows of the batch's new tokens (query rows, not KV slots)
    table: torch.Tensor  # int32 [blocks]
    end: int  # context length once its new tokens are written


@dataclass
class _Prefill:
    slot_mapping: torch.Tensor  # int64 [T]: the flat slot of every sequence's new tokens, concatenated
    seqs: list[_PrefillSeq]
    checked: bool = False  # the kernels' arguments were checked (at the first layer)


@dataclass
class _Decode:
    slot_mapping: torch.Tensor  # int64 [B]: the flat slot of each new token
    block_tables: torch.Tensor  # int32 [B, max_blocks]
    context_lens: torch.Tensor  # int32 [B]
    max_context: int  # max(context_lens), known on the host
    checked: bool = False


class PagedCache(KVCache):
    allocator: BlockManager

    def __init__(self, kernel: PagedKernel, allocator: BlockManager, **tensor_args) -> None:
        super().__init__(allocator, allocator.num_blocks, allocator.block_size, **tensor_args)
        refusal = kernel.kv_dtype_error(self.kv_dtype)
        if refusal is not None:
            raise KernelArgumentError(refusal)
        self.kernel = kernel
        # What the kernel reads, as the steps record it (``KVAllocator.decode_read_tokens``): the torch
        # reference attends a padded window of the batch's longest context (kernels/read_pattern.py).
        allocator.padded_decode_read = kernel.padded_read
        self.tables = DeviceBlockTables(self.device)
        # The host tier's memory (device.host_kv_gb): one buffer per block store, its blocks the tier's
        # slots; pinned on a GPU so the copies go by DMA. Each slot is written (stored) before it is read.
        host = allocator.host
        pinned = self.device.type == "cuda"
        self.host_buffers = [] if host is None else [
            torch.empty((host.capacity, *s.shape[1:]), dtype=s.dtype, pin_memory=pinned) for s in self.block_stores()]

    def counters(self) -> dict[str, int]:
        return self.allocator.host_counters()  # the host tier's hits and copies (none without one)

    def copy_host(self, copies: HostCopies) -> None:
        """The step's host-tier copies, of every block store: stores (device -> host) first, then loads
        (host -> device). Synchronous: the step that needs them waits, and its time includes them."""
        if copies.stores:
            last = {slot: b for b, slot in copies.stores}  # a slot stored twice in a step keeps the later
            dev = torch.tensor(list(last.values()), device=self.device)
            slots = torch.tensor(list(last.keys()))
            for store, buf in zip(self.block_stores(), self.host_buffers):
                buf[slots] = store[dev].cpu()
        if copies.loads:
            dev = torch.tensor([b for b, _ in copies.loads], device=self.device)
            slots = torch.tensor([slot for _, slot in copies.loads])
            for store, buf in zip(self.block_stores(), self.host_buffers):
                store[dev] = buf[slots].to(self.device)

    # Contexts the warm-up covers: short (one pass over the context) and long enough for
    # every kernel's split-K path (Triton and CUDA both split from 512 tokens up).
    WARMUP_CONTEXTS = (16, 4096)

    def warmup(self) -> None:
        """Call the kernels on every path a run can take, so a JIT compiles none of them later.

        Batch 1 at a short and a long context (one split, several splits), and the KV write
        with one token and with many; the inputs point at block 0 and write nowhere
        (slot -1), so the cache's contents are untouched. CPU kernels compile nothing.
        """
        if self.device.type != "cuda":
            return
        k_pool, v_pool = self.k[0], self.v[0]
        _, bs, kv_heads, head_dim = k_pool.shape
        heads = self.num_heads
        for context in self.WARMUP_CONTEXTS:
            width = blocks_for_tokens(context, bs)
            tables = torch.zeros(1, width, dtype=torch.int32, device=self.device)
            lens = torch.full((1,), context, dtype=torch.int32, device=self.device)
            q = torch.zeros(1, heads, head_dim, dtype=self.dtype, device=self.device)
            # A layer of each kind (its window, 0: full attention; sinks or none) stands for the variant it compiles.
            kinds = {(w, s is not None): layer for layer, (w, s) in enumerate(zip(self.windows, self.sinks))}
            for layer in kinds.values():
                self.kernel.decode(q, k_pool, v_pool, tables, lens, self.scale, max_context=context,
                                   **self._scales(0), **self.attention_options(layer))
        for tokens in (1, 64):
            kv = torch.zeros(tokens, kv_heads, head_dim, dtype=self.dtype, device=self.device)
            skip = torch.full((tokens,), -1, dtype=torch.long, device=self.device)
            self.kernel.write(kv, kv, k_pool, v_pool, skip, **self._scales(0))  # writes nothing: calibrates nothing
        torch.cuda.synchronize(self.device)

    def prepare_prefill(self, spans: Sequence[PrefillSpan], staging: StagingBuffer | None = None) -> _Prefill:
        bm = self.allocator
        staging = staging or StagingBuffer(self.device)
        slot_mapping = staging.add([slot for s in spans for slot in bm.slots(s.seq_id, s.start, s.end)])
        tables = [staging.add(bm.block_table(s.seq_id), torch.int32) for s in spans]
        staging.upload()
        seqs = [_PrefillSeq(queries, staging[table], s.end)
                for s, queries, table in zip(spans, query_slices(spans), tables)]
        return _Prefill(staging[slot_mapping], seqs)

    def prepare_decode(self, seq_ids: Sequence[int], staging: StagingBuffer | None = None) -> _Decode:
        bm = self.allocator
        bs = bm.block_size
        staging = staging or StagingBuffer(self.device)
        tables = [bm.block_table(s) for s in seq_ids]
        lens = [bm.num_tokens(s) for s in seq_ids]
        slot_mapping = staging.add([t[(n - 1) // bs] * bs + (n - 1) % bs for t, n in zip(tables, lens)])
        context_lens = staging.add(lens, torch.int32)
        staged = self.tables.stage(seq_ids, tables, bm.table_changes(), staging)
        staging.upload()
        return _Decode(staging[slot_mapping], self.tables.apply(staged, staging), staging[context_lens], max(lens))

    def _scales(self, layer: int) -> dict:
        """The kernels' ``scales=`` of a quantized store; nothing for a float one (every kernel takes that)."""
        return {} if self.scales is None else {"scales": self.scales[layer]}

    def _write(self, layer: int, k: torch.Tensor, v: torch.Tensor, meta: _Prefill | _Decode) -> bool:
        """Store the new tokens' K/V; return whether the kernels check their arguments this layer.

        Every layer passes tensors of the first one's shapes, dtypes and devices, so the
        first call of a step checks the kernels' arguments and the others skip it.
        """
        check, meta.checked = not meta.checked, True
        self.layer_scales(layer, k, v)  # a static scale is calibrated by the layer's first write
        # The cache computed every slot on the host: none is < 0, none to skip.
        self.kernel.write(k.contiguous(), v.contiguous(), self.k[layer], self.v[layer], meta.slot_mapping,
                          may_skip=False, validate=check, **self._scales(layer))
        return check

    def forward_prefill(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        meta: _Prefill) -> torch.Tensor:
        # Every new token of the batch is written first, before any sequence attends: a prompt
        # whose prefix hit blocks that another prompt of this batch fills reads them filled.
        self._write(layer, k, v, meta)
        k_pool, v_pool = self.k[layer], self.v[layer]
        k_scale, v_scale = (None, None) if self.scales is None else (self.scales[layer].k, self.scales[layer].v)
        outs, window, bs = [], self.windows[layer], self.allocator.block_size
        for s in meta.seqs:
            # A window's chunk reads from the block of its first query's oldest key: the blocks before are not
            # gathered (the attention is the same over any suffix of keys that holds every query's window).
            skip = max(0, s.end - (s.queries.stop - s.queries.start) - window + 1) // bs if window else 0
            table, end = s.table[skip:], s.end - skip * bs
            k_ctx = gather_kv(k_pool, table, end, k_scale, self.dtype)
            v_ctx = gather_kv(v_pool, table, end, v_scale, self.dtype)
            outs.append(prefill_attention(q[s.queries], k_ctx, v_ctx, self.scale, window, self.sinks[layer]))
        return torch.cat(outs)

    def forward_decode(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       meta: _Decode) -> torch.Tensor:
        check = self._write(layer, k, v, meta)
        # A full-attention layer without sinks calls the kernel as before: no window or sinks argument.
        return self.kernel.decode(q.contiguous(), self.k[layer], self.v[layer], meta.block_tables,
                                  meta.context_lens, self.scale, max_context=meta.max_context, validate=check,
                                  **self._scales(layer), **self.attention_options(layer))
