"""A device-side copy of the block tables, updated by difference each decode step.

Rebuilding a ``[batch, max_blocks]`` tensor from Python lists every step costs
O(batch x blocks) host work and a large host-to-device copy, which would bill the
paged impls for harness overhead. Between two steps a live table only grows at its
end or has its last entry replaced (copy-on-write), so only its tail travels; a
table the cache has not seen (a new, forked or re-admitted sequence: a new list
object) is written whole.
"""

from __future__ import annotations

from typing import Sequence

import torch


class DeviceBlockTables:
    def __init__(self, device: torch.device, rows: int = 64, cols: int = 64) -> None:
        self.device = device
        self.buf = torch.zeros(rows, cols, dtype=torch.int32, device=device)
        self._row_of: dict[int, int] = {}
        self._known: dict[int, tuple[list[int], int]] = {}  # seq -> (its table list, length written)
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

    def gather(self, seq_ids: Sequence[int], tables: Sequence[list[int]]) -> torch.Tensor:
        """int32 ``[len(seq_ids), width]`` block tables (entries past a table's end are stale)."""
        current = set(seq_ids)
        for sid in [s for s in self._row_of if s not in current]:  # finished or preempted
            self._free_rows.append(self._row_of.pop(sid))
            del self._known[sid]
        width = max(len(t) for t in tables)
        if len(current) > self.buf.shape[0] or width > self.buf.shape[1]:
            self._grow(2 * len(current), 2 * width)
        rows, cols, vals = [], [], []
        for sid, table in zip(seq_ids, tables):
            row = self._row_of.get(sid)
            if row is None:
                row = self._row_of[sid] = self._free_rows.pop()
            known = self._known.get(sid)
            start = 0 if known is None or known[0] is not table else max(known[1] - 1, 0)
            rows += [row] * (len(table) - start)
            cols += range(start, len(table))
            vals += table[start:]
            self._known[sid] = (table, len(table))
        if vals:
            self.buf[torch.tensor(rows, device=self.device), torch.tensor(cols, device=self.device)] = torch.tensor(
                vals, dtype=torch.int32, device=self.device)
        index = torch.tensor([self._row_of[s] for s in seq_ids], device=self.device)
        return self.buf[index, :width]
