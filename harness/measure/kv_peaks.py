"""Peaks of a cache's own accounting over a run.

Reserved and used bytes are each their own maximum over the run (the seeds'
and the paper's figures compare those); the waste breakdown is a snapshot taken
when the cache held the most real token states, so its parts add up.
"""

from __future__ import annotations

from dataclasses import dataclass

from impls.base import CacheStats


@dataclass
class KVPeaks:
    reserved_bytes: int = 0
    token_bytes: int = 0
    pool_bytes: int = 0
    at_peak_tokens: CacheStats | None = None

    def update(self, stats: CacheStats) -> None:
        self.reserved_bytes = max(self.reserved_bytes, stats.reserved_bytes)
        self.pool_bytes = max(self.pool_bytes, stats.pool_bytes)
        if self.at_peak_tokens is None or stats.token_bytes >= self.token_bytes:
            self.token_bytes = stats.token_bytes
            self.at_peak_tokens = stats

    def as_row(self) -> dict:
        snap = self.at_peak_tokens
        if snap is None:
            return {}
        return {
            "kv_pool_bytes": self.pool_bytes,
            "kv_bytes_reserved": self.reserved_bytes,
            "kv_bytes_used": self.token_bytes,
            "kv_bytes_logical": snap.logical_token_bytes,
            "kv_fragmentation_bytes": snap.fragmentation_bytes,
            "kv_reservation_waste_bytes": snap.reservation_waste_bytes,
            "kv_external_fragmentation_bytes": snap.external_fragmentation_bytes,
            # share of the held KV memory that holds real token states (paper: vLLM 96.3%)
            "kv_used_fraction": snap.token_bytes / snap.reserved_bytes if snap.reserved_bytes else None,
            "sharing_savings": 1 - snap.token_bytes / snap.logical_token_bytes if snap.logical_token_bytes else None,
        }
