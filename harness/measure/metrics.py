"""Derived metrics, each an explicit formula (rows, report and tests use these)."""

from __future__ import annotations

import hashlib
import json
import statistics
from typing import Iterable, Sequence

import numpy as np


def percentiles(values: Sequence[float], qs: Sequence[float], counts: Sequence[int] | None = None,
                method: str = "linear") -> list[float | None]:
    """numpy's percentile at each of ``qs`` (in [0, 100]) of ``values``; None for each when there are none.

    The one percentile of kvbench: every latency, step and profile figure comes from here.
    ``method`` is numpy's (``"linear"``, its default and vLLM's ``np.percentile``, unless a caller
    says otherwise). ``counts``: the multiset holding each value ``counts`` times, without expanding
    it (a simulated run's inter-token gaps come as few values with large counts): one sort, the
    running counts searched for the two order statistics around each rank, and numpy's own
    interpolation of them, so the figure is bit for bit ``np.percentile(np.repeat(values, counts))``.
    numpy's ``weights=`` does not serve here: it supports only ``inverted_cdf``, a step function,
    not the interpolated figure."""
    if counts is None:
        if len(values) == 0:
            return [None] * len(qs)
        return [float(v) for v in np.percentile(np.asarray(values, dtype=float), list(qs), method=method)]
    if method != "linear":
        raise ValueError(f"counted percentiles are linear only, not {method!r}")
    pairs = sorted((float(v), int(c)) for v, c in zip(values, counts) if c > 0)
    if not pairs:
        return [None] * len(qs)
    xs = np.array([v for v, _ in pairs])
    ends = np.cumsum([c for _, c in pairs])  # ends[i]: elements up to and including pair i
    total = int(ends[-1])
    # numpy's linear method on ``total`` sorted elements: virtual index (n - 1) * q, its floor and the
    # next index (clipped to the last), and _lerp's two-sided formula (exact at both ends)
    virtual = (total - 1) * np.true_divide(np.asarray(qs, dtype=float), 100)
    prev = np.floor(virtual)
    nxt = np.minimum(prev + 1, total - 1)
    gamma = virtual - prev
    a = xs[np.minimum(np.searchsorted(ends, prev, side="right"), len(xs) - 1)]
    b = xs[np.minimum(np.searchsorted(ends, nxt, side="right"), len(xs) - 1)]
    diff = b - a
    out = np.where(gamma >= 0.5, b - diff * (1 - gamma), a + diff * gamma)
    return [float(v) for v in out]


def percentile(values: Sequence[float], q: float, counts: Sequence[int] | None = None,
               method: str = "linear") -> float | None:
    """``percentiles`` at one ``q`` in [0, 100]; None for no values."""
    return percentiles(values, [q], counts, method)[0]


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
