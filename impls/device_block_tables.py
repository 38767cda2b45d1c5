"""A device-side copy of the block tables, updated by difference each decode step.

Rebuilding a ``[batch, max_blocks]`` tensor from Python lists every step costs
O(batch x blocks) host work and a large host-to-device copy, which would bill the
paged impls for harness overhead. The ``BlockManager`` reports which entries changed
since the last step (an appended block, a copy-on-write replacement, or a whole table
for a new, forked or re-admitted sequence), and only those travel. A sequence that
gets a buffer row it did not hold last step (new, or back after a preemption) is
written whole, whatever the report says: the row held someone else's table.

Two phases, so the edits ride in the step's one host-to-device copy: ``stage`` plans
on the host and queues the integers, ``apply`` edits the device buffer once uploaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from kvbench.impls.staging import StagingBuffer


@dataclass(frozen=True)
class StagedTables:
    positions: int  # staged int64: flat buffer positions to write
    values: int  # staged int32: the block ids written there
    index: int  # staged int64: buffer row of each sequence of the batch
    width: int  # blocks in the longest table of the batch


class DeviceBlockTables:
    def __init__(self, device: torch.device, rows: int = 64, cols: int = 64) -> None:
        self.device = device
        self.buf = torch.zeros(rows, cols, dtype=torch.int32, device=device)
        self._row_of: dict[int, int] = {}
        self._free_rows = list(range(rows - 1, -1, -1))

    def _grow(self, rows: int, cols: int) -> None:
        old_rows, old_cols = self.buf.shape
        new_rows, new_cols = max(rows, old_rows), max(cols, old_cols)
        if (new_rows, new_cols) == (old_rows, old_cols):
            return
        buf = torch.zeros(new_rows, new_cols, dtype=torch.int32, device=self.device)
        buf[:old_rows, :old_cols] = self.buf
        self.buf = buf
        self._free_rows = list(range(new_rows - 1, old_rows - 1, -1)) + self._free_rows

    def stage(
        self,
        seq_ids: Sequence[int],
        tables: Sequence[list[int]],
        changes: Mapping[int, int],
        staging: StagingBuffer,
    ) -> StagedTables:
        """Queue the edits that bring the batch's rows up to date.

        ``changes`` maps a sequence to the first entry of its table that changed since
        the previous call (``BlockManager.table_changes``); unlisted tables are as before.
        """
        current = set(seq_ids)
        for sid in [s for s in self._row_of if s not in current]:  # finished or preempted
            self._free_rows.append(self._row_of.pop(sid))
        width = max(len(t) for t in tables)
        if len(current) > self.buf.shape[0] or width > self.buf.shape[1]:
            self._grow(2 * len(current), 2 * width)
        cols = self.buf.shape[1]
        positions: list[int] = []
        values: list[int] = []
        index: list[int] = []
        for sid, table in zip(seq_ids, tables):
            row = self._row_of.get(sid)
            if row is None:
                row = self._row_of[sid] = self._free_rows.pop()
                start = 0
            else:
                start = changes.get(sid, len(table))
            base = row * cols
            positions += range(base + start, base + len(table))
            values += table[start:]
            index.append(row)
        return StagedTables(staging.add(positions), staging.add(values, torch.int32), staging.add(index), width)

    def apply(self, staged: StagedTables, staging: StagingBuffer) -> torch.Tensor:
        """Write the staged edits (``staging`` uploaded); int32 ``[batch, width]`` block tables.

        Entries past a table's end are stale (the kernels read only a context's blocks).
        """
        positions = staging[staged.positions]
        if positions.numel():
            self.buf.view(-1)[positions] = staging[staged.values]
        return self.buf[:, : staged.width].index_select(0, staging[staged.index])
