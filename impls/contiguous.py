"""The classic contiguous KV cache: a ``[lanes, max_seq_len, kv_heads, head_dim]`` slab per layer.

Each sequence owns one lane of ``max_seq_len`` tokens from admission to release
(``LaneAllocator``); decode attends with torch SDPA over each sequence's prefix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from kvbench.impls.base import KVCache, PrefillSpan
from kvbench.impls.flat_prefill import FlatPrefill, FlatSlotPrefill, prepare_flat_prefill
from kvbench.impls.lane_allocator import LaneAllocator
from kvbench.impls.staging import StagingBuffer
from kvbench.kernels.sdpa import additive_mask, decode_sdpa, step_bias


@dataclass
class _Decode:
    slot_mapping: torch.Tensor  # [B] flat slot of each new token
    mask: torch.Tensor  # [B, 1, 1, max_len] True where a key is visible
    max_len: int
    # When the batch's lanes are one dense range, attend over a view of the slab
    # (no K/V gather); ``order`` puts the batch in lane order and ``inverse`` back
    # (both None when it is in lane order already). Otherwise ``lanes`` gathers K/V.
    dense_start: int | None
    order: torch.Tensor | None
    inverse: torch.Tensor | None
    lanes: torch.Tensor | None  # [B] lane (slab index) of each sequence, when not dense
    # ``mask`` as SDPA's additive float mask (0 / -inf in the queries' dtype), made at the step's first
    # layer: given a boolean mask, SDPA would convert it again at every layer.
    bias: torch.Tensor | None = None
    lens: torch.Tensor | None = None  # [B] context lengths in the attended order (a sliding layer's mask)
    min_len: int = 0
    # A sliding layer's (first key read, additive mask) per window, made at the first layer of that window.
    windowed: dict[int, tuple[int, torch.Tensor]] = field(default_factory=dict)


class ContiguousCache(FlatSlotPrefill, KVCache):
    allocator: LaneAllocator

    def __init__(self, allocator: LaneAllocator, **tensor_args) -> None:
        super().__init__(allocator, allocator.num_lanes, allocator.max_seq_len, **tensor_args)
        self.gather_steps = 0  # decode steps whose sequences' lanes were not one dense range (K/V copied out)

    def counters(self) -> dict[str, int]:
        return {"kv_gather_steps": self.gather_steps}

    def prepare_prefill(self, spans: Sequence[PrefillSpan], staging: StagingBuffer | None = None) -> FlatPrefill:
        alloc = self.allocator
        return prepare_flat_prefill(alloc, lambda seq_id: alloc.lane(seq_id) * alloc.max_seq_len, spans,
                                    staging or StagingBuffer(self.device))

    def prepare_decode(self, seq_ids: Sequence[int], staging: StagingBuffer | None = None) -> _Decode:
        alloc = self.allocator
        staging = staging or StagingBuffer(self.device)
        lanes = [alloc.lane(s) for s in seq_ids]
        lens = [alloc.num_tokens(s) for s in seq_ids]
        slot_mapping = staging.add([lane * alloc.max_seq_len + n - 1 for lane, n in zip(lanes, lens)])
        max_len = max(lens)
        ordered = sorted(range(len(lanes)), key=lanes.__getitem__)
        lo = lanes[ordered[0]]
        dense = all(lanes[i] == lo + j for j, i in enumerate(ordered))
        self.gather_steps += not dense
        order = inverse = gather = None
        if not dense:
            gather = staging.add(lanes)
        elif ordered != list(range(len(ordered))):
            lens = [lens[i] for i in ordered]
            inverse_list = [0] * len(ordered)
            for j, i in enumerate(ordered):
                inverse_list[i] = j
            order, inverse = staging.add(ordered), staging.add(inverse_list)
        lens_field = staging.add(lens)
        staging.upload()
        mask = torch.arange(max_len, device=self.device)[None, :] < staging[lens_field][:, None]
        return _Decode(
            staging[slot_mapping], mask[:, None, None, :], max_len, lo if dense else None,
            None if order is None else staging[order], None if inverse is None else staging[inverse],
            None if gather is None else staging[gather], lens=staging[lens_field], min_len=min(lens),
        )

    def _window_bias(self, meta: _Decode, window: int, dtype: torch.dtype) -> tuple[int, torch.Tensor]:
        """A sliding layer's first key read and mask: no sequence reads a key before ``min_len - window``
        (those are not read at all); the rest of each sequence's keys before ``len - window`` are masked."""
        made = meta.windowed.get(window)
        if made is None or made[1].dtype != dtype:
            first = max(0, meta.min_len - window)
            pos = torch.arange(first, meta.max_len, device=self.device)[None, :]
            lens = meta.lens[:, None]
            made = first, additive_mask(((pos < lens) & (pos >= lens - window))[:, None, None, :], dtype)
            meta.windowed[window] = made
        return made

    def forward_decode(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       meta: _Decode) -> torch.Tensor:
        self.write_flat(layer, k, v, meta.slot_mapping)
        window = self.windows[layer]
        first, bias = self._window_bias(meta, window, q.dtype) if window else (None, None)
        keys_read = slice(first, meta.max_len)  # first None: from position 0
        # ``read`` gives views of a float slab; a quantized one's prefixes dequantized (timed with the step).
        if meta.dense_start is not None:
            span = slice(meta.dense_start, meta.dense_start + q.shape[0])
            keys, values = self.read(layer, (span, keys_read))
            if meta.order is not None:
                q = q[meta.order]
        else:
            keys, values = self.read(layer, (meta.lanes, keys_read))
        out = decode_sdpa(q, keys, values, self.scale, step_bias(meta, q.dtype) if bias is None else bias,
                          self.sinks[layer])
        return out[meta.inverse] if meta.inverse is not None else out
