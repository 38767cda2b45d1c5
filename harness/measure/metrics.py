"""Derived metrics, each an explicit formula (rows, report and tests use these)."""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from typing import Iterable, Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile ``q`` in [0, 100]; None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def per_second(count: float, seconds: float) -> float | None:
    return count / seconds if seconds > 0 else None


def output_digest(outputs: Iterable[tuple[int, int, Sequence[int]]]) -> str:
    """Hash of every (request_id, sample, output_ids): equal iff the generated tokens are equal."""
    h = hashlib.sha256()
    for rid, sample, ids in sorted(outputs, key=lambda o: (o[0], o[1])):
        h.update(json.dumps([rid, sample, list(ids)]).encode())
    return h.hexdigest()[:16]


def median_and_spread(values: Sequence[float]) -> tuple[float | None, float | None]:
    """Median and relative spread ((max - min) / median) over repeats."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None, None
    med = statistics.median(vals)
    return med, ((max(vals) - min(vals)) / med if med else None)


def attention_bytes(batch: int, context: int, num_heads: int, kv_heads: int, head_dim: int, elem_bytes: int,
                    kv_elem_bytes: int | None = None, kv_scale_bytes: int = 0) -> int:
    """Bytes a decode-attention call must move: K and V of every context token, Q and the output.

    A quantized cache's K and V are ``kv_elem_bytes`` an element plus ``kv_scale_bytes`` per token,
    head, K and V (per-token scales; a per-tensor scale is a few bytes a call, not counted)."""
    kv_elem = elem_bytes if kv_elem_bytes is None else kv_elem_bytes
    kv = 2 * batch * context * kv_heads * (head_dim * kv_elem + kv_scale_bytes)
    q_out = 2 * batch * num_heads * head_dim * elem_bytes
    return kv + q_out


def bandwidth_gbps(num_bytes: int, seconds: float) -> float:
    return num_bytes / seconds / 1e9
