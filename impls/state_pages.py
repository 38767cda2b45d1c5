"""Linear-attention states in the pool's pages: each sequence's state is the bytes of its state pages.

A state group (``LinearState``, impls/attention_kinds.py) gives each sequence ``state_blocks`` pages of the one
pool (impls/group_pool.py), as vLLM does; the grouped cache (impls/grouped_paged.py) holds, per page layer, a K and
a V tensor ``[P + 1, block_size, kv_heads, head_dim]``. Layer j of a state group keeps its sequence's state in the
K and V rows of page layer j at that sequence's pages: page by page, its K page then its V page, so one
sequence's region is ``pages x 2 x block_size x kv_heads x head_dim`` values, at least its state (the pool sized
it so: harness/kv/latent.py ``state_tokens``), in the store's dtype. A step gathers each sequence's region into
one row (``StateRows.read``) and scatters the new state back (``write``): the pages stay where they are, so a fork
shares them and its first write copies them whole (a ``SlotCopy`` a page, as any block), and a release frees them.

A state starts from zeros at a sequence's first write: a prompt's span that starts at 0 (no prefix hit can serve a
state, so a pool with one caches no prefix; a recomputed sequence starts over) reads zeros, whatever its recycled
pages held. The gather/scatter is torch indexing, on whatever device the pool is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from kvbench.impls.base import StateRows
from kvbench.impls.staging import StagingBuffer


@dataclass(frozen=True)
class StagedStates:
    """A step's state fields in its staging buffer, before upload: per state group its pages, and the fresh flags."""

    lengths: tuple[int, ...]
    pages: dict[int, tuple[int, int]]  # group -> (staging handle of its [N * pages] ids, pages a sequence)
    fresh: int  # handle of [N] 0/1: 1 where the span is the sequence's first write


@dataclass(frozen=True)
class StatePages:
    """A step's sequences' state pages in each state group (``[N, pages]`` on the device), and which are fresh."""

    lengths: tuple[int, ...]
    pages: dict[int, torch.Tensor]
    fresh: torch.Tensor  # [N] bool


def stage_states(tables: Sequence[Sequence[list[int]]], state_groups: Sequence[int], lengths: Sequence[int],
                 fresh: Sequence[bool], staging: StagingBuffer) -> StagedStates | None:
    """Queue the state fields of a step's sequences (``tables``: each one's block tables, per group), before the
    buffer's upload; None when the pool has no state group."""
    if not state_groups:
        return None
    pages = {}
    for g in state_groups:
        per = len(tables[0][g]) if tables else 0
        if any(len(t[g]) != per for t in tables):
            raise AssertionError(f"state group {g}: every sequence holds the same pages, got "
                                 f"{[len(t[g]) for t in tables]}")
        pages[g] = (staging.add([b for t in tables for b in t[g]]), per)
    return StagedStates(tuple(lengths), pages, staging.add([int(f) for f in fresh]))


def state_pages(staged: StagedStates | None, staging: StagingBuffer) -> StatePages | None:
    """The staged fields as device tensors, after the upload."""
    if staged is None:
        return None
    n = len(staged.lengths)
    return StatePages(staged.lengths, {g: staging[h].view(n, per) for g, (h, per) in staged.pages.items()},
                      staging[staged.fresh].bool())


def state_rows(k: torch.Tensor, v: torch.Tensor, meta: StatePages, group: int) -> StateRows:
    """The ``StateRows`` of a layer whose page layer's stores are ``k`` and ``v`` (``[P + 1, block_size, ...]``),
    for the sequences of ``meta`` in state group ``group``."""
    pages = meta.pages[group]
    n, per = pages.shape
    k_pages, v_pages = k.view(k.shape[0], -1), v.view(v.shape[0], -1)
    page_values = k_pages.shape[1]
    capacity = per * 2 * page_values
    flat_pages = pages.reshape(-1)

    def read() -> torch.Tensor:
        rows = torch.stack((k_pages[flat_pages], v_pages[flat_pages]), dim=1).view(n, capacity)
        # where, not a multiply: a recycled page may hold anything, a NaN included
        return torch.where(meta.fresh[:, None], torch.zeros((), dtype=rows.dtype, device=rows.device), rows)

    def write(rows: torch.Tensor) -> None:
        if rows.shape[0] != n or rows.shape[1] > capacity:
            raise ValueError(f"state rows must be [{n}, <= {capacity}], got {tuple(rows.shape)}")
        full = torch.nn.functional.pad(rows.to(k.dtype), (0, capacity - rows.shape[1]))
        full = full.view(n * per, 2, page_values)
        k_pages[flat_pages] = full[:, 0]
        v_pages[flat_pages] = full[:, 1]

    return StateRows(meta.lengths, capacity, read, write)
