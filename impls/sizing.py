"""KV sizing from plain numbers: what every cache kind, the capacity math and the reports share."""

from __future__ import annotations


def kv_bytes_per_token(num_layers: int, kv_heads: int, head_dim: int, dtype_bytes: int,
                       scale_bytes: int = 0) -> int:
    """K and V of one token across all layers: ``2 * layers * kv_heads * (head_dim * dtype bytes + scale bytes)``.

    ``scale_bytes``: what a quantized cache stores beside each head's values (kernels/kv_formats.py).
    """
    return 2 * num_layers * kv_heads * (head_dim * dtype_bytes + scale_bytes)


def blocks_for_tokens(num_tokens: int, block_size: int) -> int:
    """Blocks of ``block_size`` slots that ``num_tokens`` tokens occupy."""
    return -(-num_tokens // block_size)


class CacheSizeError(ValueError):
    """A KV budget that cannot hold even one request of the workload."""
