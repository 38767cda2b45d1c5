"""Prefill for caches that keep each sequence's tokens in one run of flat slots (a contiguous
lane, an Orca region): the new tokens' K/V go to their slots, and each prompt attends over
its own run of slots in place. Shared by ``ContiguousCache`` and ``RegionCache``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from kvbench.impls.allocator import KVAllocator
from kvbench.impls.base import PrefillSpan, query_slices
from kvbench.impls.staging import StagingBuffer
from kvbench.kernels.prefill import prefill_attention


@dataclass
class FlatPrefillSeq:
    queries: slice  # this sequence's rows of the batch's new tokens (query rows, not KV slots)
    first_slot: int  # flat slot of its position 0
    end: int  # context length once its new tokens are written


@dataclass
class FlatPrefill:
    slot_mapping: torch.Tensor  # flat slots of every sequence's new tokens, concatenated
    seqs: list[FlatPrefillSeq]


def prepare_flat_prefill(alloc: KVAllocator, first_slot: Callable[[int], int], spans: Sequence[PrefillSpan],
                         staging: StagingBuffer) -> FlatPrefill:
    """Stage and upload the new tokens' slots; ``first_slot(seq_id)`` is where a sequence starts."""
    slot_mapping = staging.add([slot for s in spans for slot in alloc.slots(s.seq_id, s.start, s.end)])
    seqs = [FlatPrefillSeq(queries, first_slot(s.seq_id), s.end) for s, queries in zip(spans, query_slices(spans))]
    staging.upload()
    return FlatPrefill(staging[slot_mapping], seqs)


class FlatSlotPrefill:
    """``forward_prefill`` of a cache whose slots are one flat token array per layer (``write_flat``):
    the contiguous and region caches. Mixed in before ``KVCache``."""

    def forward_prefill(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        meta: FlatPrefill) -> torch.Tensor:
        self.write_flat(layer, k, v, meta.slot_mapping)
        # Each prompt's run of slots through ``read``: a view of a float store, dequantized otherwise.
        return torch.cat([
            prefill_attention(q[s.queries], *self.read(layer, slice(s.first_slot, s.first_slot + s.end), flat=True),
                              self.scale, self.windows[layer], self.sinks[layer])
            for s in meta.seqs
        ])
