"""One host-to-device copy per step: every integer a step needs, packed into one buffer.

A decode step needs a handful of small integer tensors (token ids, positions, slots,
context lengths, block-table edits). Made one by one from Python lists, each is a
pageable ``torch.tensor`` copy the driver stages and waits for, several per step. Here
the engine and the cache each ``add`` their fields, ``upload`` packs them into one
host buffer (pinned on CUDA, so the copy is truly asynchronous) and copies it with a
single non-blocking transfer; every field is then a view of the device buffer. On CPU
the host buffer is the device buffer: no copy at all.
"""

from __future__ import annotations

from array import array
from typing import Iterable

import torch


_ALIGN = 16  # bytes


class StagingBuffer:
    """Integer fields of one step; int64 and int32 fields share one int64 buffer."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._int64: list[int] = []
        self._int32: list[int] = []
        self._fields: list[tuple[bool, int, int]] = []  # (int32?, start, end) in its part
        self._views: list[torch.Tensor] | None = None

    def add(self, values: Iterable[int], dtype: torch.dtype = torch.int64) -> int:
        """Queue ``values`` as one field of ``dtype`` (int64 or int32); returns its handle."""
        if dtype not in (torch.int64, torch.int32):
            raise ValueError(f"a staged field is int64 or int32, not {dtype}")
        if self._views is not None:
            raise RuntimeError("the buffer is uploaded already: add every field before upload()")
        part = self._int32 if dtype == torch.int32 else self._int64
        # Every field starts on a 16-byte boundary: Triton specialises a pointer argument
        # on 16-byte alignment, so a field at an odd offset would compile a second variant
        # of a kernel in the middle of a measured run (seen on an H200), and the CUDA
        # kernels' vector loads want it too.
        part.extend([0] * (-len(part) % (_ALIGN // (4 if dtype == torch.int32 else 8))))
        start = len(part)
        part.extend(values)
        self._fields.append((dtype == torch.int32, start, len(part)))
        return len(self._fields) - 1

    def upload(self) -> None:
        """Pack every field, copy them to the device at once, and make each field's view."""
        # The int32 part rides at the end, on a 16-byte boundary, two values per int64 element.
        self._int64.extend([0] * (-len(self._int64) % (_ALIGN // 8)))
        data = array("q", self._int64)
        data.frombytes(array("i", self._int32 + [0] * (len(self._int32) % 2)).tobytes())
        # array -> tensor without a per-element conversion (torch.tensor(list) is ~3x slower).
        host = torch.frombuffer(data, dtype=torch.int64) if data else torch.empty(0, dtype=torch.int64)
        if self.device.type == "cuda":
            # The caching host allocator keeps the pinned block until the copy has run.
            buf = host.pin_memory().to(self.device, non_blocking=True)
        else:
            buf = host.to(self.device)  # CPU: the same tensor, no copy
        int32 = buf[len(self._int64):].view(torch.int32)
        self._views = [(int32 if is32 else buf)[start:end] for is32, start, end in self._fields]

    def __getitem__(self, handle: int) -> torch.Tensor:
        """The device tensor of field ``handle`` (after ``upload``)."""
        if self._views is None:
            raise RuntimeError("upload() first: fields have no device tensors before it")
        return self._views[handle]
