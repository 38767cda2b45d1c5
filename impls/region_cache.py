"""Variable-size contiguous regions in one ``[1, capacity, kv_heads, head_dim]`` buffer per layer.

The tensors of the Orca (Pow2) and Orca (Oracle) baselines (``RegionAllocator``). Their
point is memory, not kernel speed: decode gathers each sequence's keys and values out of
its region into a ``[B, max_len, ...]`` batch and attends with torch SDPA, exactly as the
contiguous cache does over its lanes (same shapes, same mask), so the tokens match it.
Every decode step gathers (``kernel_backend`` says ``sdpa+gather``; ``kv_gather_steps``
counts them). Prefill reads each region's prefix in place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from kvbench.impls.base import KVCache, PrefillSpan
from kvbench.impls.flat_prefill import FlatPrefill, FlatSlotPrefill, prepare_flat_prefill
from kvbench.impls.region_allocator import RegionAllocator
from kvbench.impls.staging import StagingBuffer
from kvbench.kernels.sdpa import additive_mask, decode_sdpa, step_bias


@dataclass
class _Decode:
    slot_mapping: torch.Tensor  # [B] flat slot of each new token
    gather: torch.Tensor  # [B, max_len] flat slot of each key (past a sequence's length: its last slot, masked)
    mask: torch.Tensor  # [B, 1, 1, max_len] True where a key is visible
    positions: torch.Tensor  # [1, max_len] each key's position
    lens: torch.Tensor  # [B, 1] each sequence's length
    bias: torch.Tensor | None = None  # ``mask`` as SDPA's float mask, made once a step (kernels/sdpa.py step_bias)
    windowed: dict[int, torch.Tensor] = field(default_factory=dict)  # a sliding layer's float mask, per window


class RegionCache(FlatSlotPrefill, KVCache):
    allocator: RegionAllocator

    def __init__(self, allocator: RegionAllocator, **tensor_args) -> None:
        super().__init__(allocator, 1, allocator.pool_tokens, **tensor_args)
        self.gather_steps = 0  # decode steps that copied K/V out of the regions (all of them)

    def counters(self) -> dict[str, int]:
        return {"kv_gather_steps": self.gather_steps}

    def prepare_prefill(self, spans: Sequence[PrefillSpan], staging: StagingBuffer | None = None) -> FlatPrefill:
        return prepare_flat_prefill(self.allocator, self.allocator.start, spans, staging or StagingBuffer(self.device))

    def prepare_decode(self, seq_ids: Sequence[int], staging: StagingBuffer | None = None) -> _Decode:
        alloc = self.allocator
        staging = staging or StagingBuffer(self.device)
        starts = [alloc.start(s) for s in seq_ids]
        lens = [alloc.num_tokens(s) for s in seq_ids]
        slot_mapping = staging.add([start + n - 1 for start, n in zip(starts, lens)])
        starts_field, lens_field = staging.add(starts), staging.add(lens)
        staging.upload()
        self.gather_steps += 1
        positions = torch.arange(max(lens), device=self.device)[None, :]
        seq_lens = staging[lens_field][:, None]
        # Slots past a sequence's length repeat its last slot: inside its region, and masked out.
        gather = staging[starts_field][:, None] + torch.minimum(positions, seq_lens - 1)
        return _Decode(staging[slot_mapping], gather, (positions < seq_lens)[:, None, None, :], positions, seq_lens)

    def forward_decode(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       meta: _Decode) -> torch.Tensor:
        self.write_flat(layer, k, v, meta.slot_mapping)
        keys, values = self.read(layer, meta.gather, flat=True)  # [B, max_len, KVH, D], dequantized if quantized
        window = self.windows[layer]
        bias = self._window_bias(meta, window, q.dtype) if window else step_bias(meta, q.dtype)
        return decode_sdpa(q, keys, values, self.scale, bias, self.sinks[layer])

    def _window_bias(self, meta: _Decode, window: int, dtype: torch.dtype) -> torch.Tensor:
        """A sliding layer's mask: each sequence's last ``window`` keys (made once a step per window)."""
        made = meta.windowed.get(window)
        if made is None:
            visible = (meta.positions < meta.lens) & (meta.positions >= meta.lens - window)
            made = meta.windowed[window] = additive_mask(visible[:, None, None, :], dtype)
        return made
