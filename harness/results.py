"""A run is a folder: resolved config, env.json, rows (CSV + Parquet), side tables, tokens.

Rows are tidy: one per measured job, identifiers first, then the fingerprint,
status, and metrics. Columns that do not apply stay empty (never invented).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

import pandas as pd

IDENTIFIERS = [
    "run_id", "scenario", "impl", "cache", "kernel", "kernel_backend", "model", "dtype", "block_size", "batch",
    "max_seq_len", "workload", "num_requests", "prompt_len", "output_len", "shared_prefix_len",
    "n", "seed", "repeat", "workload_digest",
]
FINGERPRINT = [
    "device", "device_slug", "gpu_name", "gpu_count", "gpu_memory_bytes", "driver_version",
    "cuda_version", "cpu_name", "cpu_count", "torch_version", "triton_version", "python_version",
    "git_sha", "git_dirty", "hostname_hash",
]
STATUS = ["status", "error", "notes"]
METRICS = [
    "wall_s", "tokens_per_s", "tokens_per_s_spread", "output_tokens_per_s", "requests_per_s",
    "step_ms_p50", "step_ms_p90", "step_ms_p99",
    "host_ms_p50", "host_ms_p90",  # decode: a step's host time, until its forward is enqueued (no sync)
    "ttft_ms_p50", "ttft_ms_p99",
    "decode_steps", "output_tokens", "prompt_tokens", "prefill_tokens", "cache_hit_tokens",
    "peak_concurrency", "max_concurrency", "max_concurrency_analytic", "preemptions", "rejected",
    "kv_bytes_per_token", "kv_pool_bytes", "kv_bytes_reserved", "kv_bytes_used", "kv_bytes_logical",
    "kv_fragmentation_bytes", "kv_reservation_waste_bytes",
    "kv_external_fragmentation_bytes",  # free KV memory in holes too small for the first waiting request
    "kv_used_fraction", "sharing_savings",
    "weight_bytes", "budget_kv_bytes", "budget_device_bytes", "budget_source",
    "nvml_used_bytes", "nvml_process_bytes", "nvml_baseline_bytes", "torch_allocated_bytes",
    "torch_reserved_bytes", "rss_bytes",
    "energy_j", "avg_power_w", "energy_per_output_token_j",  # NVML's board energy counter over the run
    "output_digest",
    "kv_gather_steps",  # contiguous: decode steps that copied K/V out of non-adjacent slots
    # scenario=max_concurrency
    "probes",
    # scenario=kernel
    "layout", "kernel_batch", "context_len", "num_heads", "num_kv_heads", "head_dim",
    "latency_us_p50", "latency_us_p10", "latency_us_p90", "bytes_moved", "bandwidth_gbps",
    "copy_bw_gbps", "peak_bw_gbps", "frac_copy_bw", "frac_peak_bw", "max_abs_err",
]
TEXT_METRICS = ("budget_source", "output_digest", "layout")  # the metric columns that are not numbers
COLUMNS = IDENTIFIERS + FINGERPRINT + STATUS + METRICS


def tidy(rows: Iterable[dict]) -> pd.DataFrame:
    """Rows as a frame with the schema's columns first (missing ones empty), extras after."""
    df = pd.DataFrame(list(rows))
    for col in COLUMNS:
        if col not in df.columns:
            df[col] = None
    extras = [c for c in df.columns if c not in COLUMNS]
    return df[COLUMNS + extras]


def write_table(df: pd.DataFrame, path_stem: Path) -> None:
    """``<stem>.csv`` and ``<stem>.parquet`` (object columns of mixed types kept as strings)."""
    df.to_csv(path_stem.with_suffix(".csv"), index=False)
    pq = df.copy()
    for col in pq.columns:
        if pq[col].dtype == object:
            kinds = {type(v) for v in pq[col].dropna()}
            if len(kinds) > 1 or kinds & {dict, list, tuple}:
                pq[col] = pq[col].map(lambda v: None if v is None else str(v))
    pq.to_parquet(path_stem.with_suffix(".parquet"), index=False)


def write_run(run_dir: Path, rows: list[dict], tables: dict[str, pd.DataFrame] | None = None) -> pd.DataFrame:
    run_dir.mkdir(parents=True, exist_ok=True)
    df = tidy(rows)
    write_table(df, run_dir / "rows")
    for name, table in (tables or {}).items():
        write_table(table, run_dir / name)
    return df


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, default=str) + "\n")


def write_tokens(path: Path, records: list[dict]) -> None:
    """One JSON object per line: impl, request_id, sample, prompt_ids, output_ids."""
    with path.open("w") as f:
        for rec in records:
            f.write(json.dumps(rec) + "\n")
