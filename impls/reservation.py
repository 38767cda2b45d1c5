"""Contiguous reservation policies: how many slots a sequence reserves at admission.

The PagedAttention paper's baselines (its section 6.1) are one system, Orca, under
three policies; each sequence holds one contiguous region from admission to release:

* ``max``: ``max_seq_len`` slots whatever the request (Orca (Max)); every region has
  the same size, so the lane allocator (impls/lane_allocator.py) serves it.
* ``pow2``: the next power of two of prompt + output (Orca (Pow2)): at most 2x over.
  Capped at ``max_seq_len``, which no sequence outgrows, so it never reserves more than ``max``.
* ``oracle``: exactly prompt + output, as if the output length were known (Orca (Oracle)).

``pow2`` and ``oracle`` give regions of different sizes: impls/region_allocator.py.
"""

from __future__ import annotations

from typing import Callable

# (final length = prompt + output, max_seq_len) -> slots reserved
Reservation = Callable[[int, int], int]


def reserve_max(total_len: int, max_seq_len: int) -> int:
    return max_seq_len


def reserve_pow2(total_len: int, max_seq_len: int) -> int:
    pow2 = 1 << max(total_len - 1, 0).bit_length()  # the smallest power of two >= total_len
    return max(total_len, min(pow2, max_seq_len))


def reserve_oracle(total_len: int, max_seq_len: int) -> int:
    return total_len


RESERVATIONS: dict[str, Reservation] = {"max": reserve_max, "pow2": reserve_pow2, "oracle": reserve_oracle}
