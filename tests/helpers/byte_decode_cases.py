"""Every byte of a one-byte KV format through a decode kernel: its value as torch's cast gives it.

One token per sequence, K all zeros: each query's softmax over that one row is exactly 1, so an
fp32 output row is its V row dequantized, ``float(byte) * scale``, with no rounding in between.
A scale that is a power of two keeps the product exact, so the kernel's decode of all 256 bit
patterns (NaN and inf included) is compared with torch's for equality, not within a tolerance.
"""

from __future__ import annotations

import torch

from kvbench.kernels.quant import KVScales
from tests.helpers.kernel_cases import DecodeKernel

BYTE_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.int8)


def check_every_byte(kernel: DecodeKernel, dtype: torch.dtype, dynamic: bool, head_dim: int = 64) -> None:
    """``kernel`` decodes all 256 bytes of ``dtype`` as torch does, at a per-tensor or per-token scale."""
    rows = 256 // head_dim
    stored = torch.arange(256, dtype=torch.uint8).view(dtype).view(rows, 1, 1, head_dim)  # a block per token
    k_cache = torch.zeros_like(stored)
    # A different power of two per token when dynamic: a mix-up of rows' scales shows.
    row_scales = torch.tensor([2.0 ** (i - 2) for i in range(rows)]).view(rows, 1, 1)
    scale = row_scales if dynamic else torch.tensor(0.125)
    scales = KVScales(torch.ones_like(scale), scale.contiguous(), dynamic)
    q = torch.randn(rows, 2, head_dim)  # two query heads on the one kv head
    tables = torch.arange(rows, dtype=torch.int32).view(rows, 1)
    lens = torch.ones(rows, dtype=torch.int32)
    got = kernel(q, k_cache, stored, tables, lens, head_dim**-0.5, out=torch.empty_like(q), scales=scales)
    want = (stored.float() * (scale.view(rows, 1, 1, 1) if dynamic else scale)).view(rows, 1, head_dim).expand_as(q)
    assert torch.equal(got.isnan(), want.isnan()), f"{dtype}: NaN bytes decode differently"
    finite = ~want.isnan()
    assert torch.equal(got[finite], want[finite]), f"{dtype}: bytes decode differently from torch's cast"
