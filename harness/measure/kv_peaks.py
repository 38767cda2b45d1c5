"""Peaks of a cache's own accounting over a run.

Reserved and used slots are each their own maximum over the run (the seeds'
and the paper's figures compare those); the waste breakdown is a snapshot taken
when the cache held the most used slots, so its parts add up. The allocators
report slots in tokens (``CacheUsage``); the row's bytes are made here, in ``as_row``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.impls.allocator import CacheUsage


@dataclass
class KVPeaks:
    bytes_per_token: int  # KV bytes of one token, every layer, K and V
    reserved_tokens: int = 0
    used_tokens: int = 0
    pool_tokens: int = 0
    at_peak_used: CacheUsage | None = None

    def update(self, usage: CacheUsage) -> None:
        self.reserved_tokens = max(self.reserved_tokens, usage.reserved_tokens)
        self.pool_tokens = max(self.pool_tokens, usage.pool_tokens)
        if self.at_peak_used is None or usage.used_tokens >= self.used_tokens:
            self.used_tokens = usage.used_tokens
            self.at_peak_used = usage

    @property
    def reserved_bytes(self) -> int:
        return self.reserved_tokens * self.bytes_per_token

    @property
    def used_bytes(self) -> int:
        return self.used_tokens * self.bytes_per_token

    def as_row(self) -> dict:
        snap = self.at_peak_used
        if snap is None:
            return {}
        bpt = self.bytes_per_token
        return {
            "kv_pool_bytes": self.pool_tokens * bpt,
            "kv_bytes_reserved": self.reserved_bytes,
            "kv_bytes_used": self.used_bytes,
            "kv_bytes_logical": snap.logical_tokens * bpt,
            "kv_fragmentation_bytes": snap.fragmentation_tokens * bpt,
            "kv_reservation_waste_bytes": snap.reservation_waste_tokens * bpt,
            "kv_external_fragmentation_bytes": snap.external_fragmentation_tokens * bpt,
            # share of the held KV memory that holds real token states (paper: vLLM 96.3%)
            "kv_used_fraction": snap.used_tokens / snap.reserved_tokens if snap.reserved_tokens else None,
            "sharing_savings": 1 - snap.used_tokens / snap.logical_tokens if snap.logical_tokens else None,
        }
