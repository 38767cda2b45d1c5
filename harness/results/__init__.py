"""A run is a folder: resolved config, env.json, rows (CSV + Parquet), side tables, tokens.

Rows are tidy: one per measured job, identifiers first, then the fingerprint,
status, and metrics. Columns that do not apply stay empty (never invented).
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Callable, Iterable

import pandas as pd

IDENTIFIERS = [
    "run_id", "scenario", "impl", "cache", "kernel", "kernel_backend", "eviction", "host_kv_gb",
    "preemption", "host_copy", "model", "dtype", "kv_dtype", "kv_scale", "block_size", "batch",
    "chunked_prefill", "max_num_batched_tokens", "max_seq_len", "workload", "num_requests", "prompt_len", "output_len", "shared_prefix_len",
    "n", "seed", "repeat", "cpu_threads", "workload_digest", "trace_sha256",
    "job_id",  # harness/job/identity.py: what `resume=true` matches a folder's rows by
    "replay_of",  # harness/front/replay.py: the run folder this row re-ran
]
FINGERPRINT = [
    "device", "device_slug", "gpu_name", "gpu_count", "gpu_memory_bytes", "driver_version",
    "cuda_version", "cpu_name", "cpu_count", "torch_version", "triton_version", "python_version",
    "git_sha", "git_dirty", "hostname_hash",
    "measured_at",  # when the row was measured: UTC, ISO 8601 to the second (a kept row keeps its own)
    "fingerprint_diff",  # a replay: the fields above that differ from the original run's
]
STATUS = ["status", "error", "notes"]
# What a row's ``status`` may say: measured, out of memory, failed, not applicable, stopped by a signal.
STATUSES = ("ok", "oom", "error", "skipped", "interrupted")
# What every row names, whatever its status (the report reads no row without them).
REQUIRED = ("scenario", "status")
METRICS = [
    "wall_s", "tokens_per_s", "tokens_per_s_spread", "output_tokens_per_s", "requests_per_s",
    "step_ms_p50", "step_ms_p90", "step_ms_p99",
    "prefill_step_ms_p50", "prefill_step_ms_p90", "prefill_steps",  # decode: prefill steps, apart from step_ms_*
    "host_ms_p50", "host_ms_p90",  # decode: a step's host time, until its forward is enqueued (no sync)
    # decode on CPU: whether the dense work ran compiled, its compile (untimed), and the eager GEMMs and
    # element-wise ops it ran
    "cpu_compile", "compile_s", "linear_backend", "elementwise_backend",
    "decode_steps", "output_tokens", "prompt_tokens", "prefill_tokens", "cache_hit_tokens",
    # prefix-cache reuse (harness/serving/reuse_meter.py, prefix_reuse.py): prompt tokens served from the
    # cache at first admission over prompt tokens, vLLM's convention (a prompt's last token is always
    # computed); the same with an unbounded cache, from the workload alone; cached blocks evicted;
    # tokens computed again when a preempted sequence was re-admitted
    "prefix_hit_rate", "prefix_hit_rate_ideal", "evicted_blocks", "recomputed_tokens",
    "host_hit_tokens", "host_stored_blocks", "host_loaded_blocks", "swapped_out",  # device.host_kv_gb, preemption=swap
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
    "kv_gather_steps",  # contiguous: decode steps that copied K/V out of non-adjacent lanes
    # service (harness/serving/service_metrics.py): arrivals, per-request latency, SLO and goodput
    "arrival", "request_rate", "achieved_rps", "duration_s", "idle_s", "clock", "gpu", "slo",
    "clock_source",  # a simulated clock's prices: a profile's id (scenario=profile), or roofline-v<N> (cost_model.py)
    *[f"{m}_ms_{s}" for m in ("ttft", "tpot", "itl", "e2el", "queue") for s in ("mean", "p50", "p90", "p99")],
    "normalized_latency_s", "goodput_rps", "slo_attainment", "slo_pass",
    # scenario=profile: the median share of a step spent in the cache's attention (K/V write and kernel)
    "attention_share_decode", "attention_share_prefill", "attention_share_decode_top",
    # scenario=profile with scenario.wall: re-timed points over first timed ones, less 1, at the job's end
    "profile_drift",
    # decode at a quantized kv_dtype (harness/serving/kv_accuracy.py): against the same run at kv_dtype=auto
    "kv_top1_agreement", "kv_kl_mean", "kv_greedy_agreement", "kv_perplexity", "kv_ref_perplexity",
    "kv_accuracy_positions", "kv_accuracy_gate", "kv_accuracy_rule", "kv_accuracy_weights",
    # scenario=max_rate
    "max_rate_rps",
    # scenario=max_concurrency
    "probes",
    # scenario=kernel
    "layout", "kernel_batch", "context_len", "num_heads", "num_kv_heads", "head_dim",
    "latency_us_p50", "latency_us_p10", "latency_us_p90", "bytes_moved", "bandwidth_gbps",
    "copy_bw_gbps", "peak_bw_gbps", "frac_copy_bw", "frac_peak_bw", "max_abs_err",
    "max_rel_err",  # max_abs_err over the reference output's largest magnitude
    "kv_quant_max_abs_err",  # a quantized cache: the reference over it against the reference over the float K/V
    "sm_clock_mhz", "clock_throttle_reasons",  # NVML, right after a kernel point's timed calls (GPU only)
    # CPU: what the process got while measured (harness/measure/contention.py); contended rows say so in notes
    "cpu_util", "run_queue_wait_frac", "load_avg_before", "load_avg_after", "steal_frac", "others_cpu",
    "contended",
]
TEXT_METRICS = ("kv_accuracy_gate", "kv_accuracy_rule", "kv_accuracy_weights", "budget_source", "output_digest", "layout", "arrival", "clock", "gpu", "slo", "clock_throttle_reasons",
                "clock_source", "linear_backend", "elementwise_backend")  # the metric columns that are not numbers
COLUMNS = IDENTIFIERS + FINGERPRINT + STATUS + METRICS
# Columns of true/false (a CSV gives them back as the text "True"/"False").
BOOLEANS = ("git_dirty", "contended", "slo_pass", "cuda_graph", "cpu_compile")
# Counts (tokens, steps, requests, heads, ...) are whole numbers; with every byte column they are
# stored as nullable integers, so an empty cell stays empty instead of turning the column into floats.
COUNTS = (
    "block_size", "batch", "max_seq_len", "num_requests", "prompt_len", "output_len", "shared_prefix_len",
    "n", "seed", "repeat", "cpu_threads", "gpu_count", "cpu_count",
    "decode_steps", "prefill_steps", "output_tokens", "prompt_tokens", "prefill_tokens", "cache_hit_tokens", "peak_concurrency",
    "max_concurrency", "max_concurrency_analytic", "preemptions", "rejected", "kv_gather_steps", "probes", "kv_accuracy_positions",
    "kernel_batch", "context_len", "num_heads", "num_kv_heads", "head_dim", "bytes_moved", "sm_clock_mhz",
    "piecewise_steps", "concurrency", "running", "waiting", "tokens",
    "evicted_blocks", "recomputed_tokens", "prefix_hit_tokens", "admitted_prompt_tokens",
    "host_hit_tokens", "host_stored_blocks", "host_loaded_blocks", "swapped_out",
)


def is_count(column: str) -> bool:
    """A count, or a byte column (``kv_bytes_reserved``, ``weight_bytes``: a word ``bytes`` in its name)."""
    return column in COUNTS or "bytes" in column.split("_")


def as_bool(v):
    """True, False, or NA for a true/false cell as Python, Parquet or a CSV wrote it."""
    if v is None or v is pd.NA or (isinstance(v, float) and v != v):
        return pd.NA
    key = v.strip().lower() if isinstance(v, str) else v
    if key in (True, 1, "true", "1", "yes"):
        return True
    if key in (False, 0, "false", "0", "no"):
        return False
    return pd.NA


def typed(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with counts and byte columns as nullable integers and true/false columns as nullable
    booleans (returned; the columns are replaced in one assignment). A column that holds a fraction or
    text is left as it is: a value is never rounded or invented to fit a type."""
    changed: dict[str, pd.Series] = {}
    present = df.notna().any()  # per column, in one pass: most of a row's columns are empty
    for col in df.columns:
        if col in BOOLEANS:
            if str(df[col].dtype) != "boolean":
                changed[col] = df[col].map(as_bool, na_action="ignore").astype("boolean")
        elif is_count(col) and str(df[col].dtype) != "Int64":
            if not present[col]:  # no numbers to check
                changed[col] = pd.Series(pd.array([pd.NA] * len(df), dtype="Int64"), index=df.index)
                continue
            values = df[col]
            numbers = pd.to_numeric(values, errors="coerce")
            whole = numbers.dropna()
            if numbers.notna().sum() == values.notna().sum() and (whole == whole.round()).all() \
                    and (whole.abs() < 2**63).all():
                changed[col] = numbers.round().astype("Int64")
    if changed:  # one assignment: a column at a time copies the frame's blocks once per column
        df[list(changed)] = pd.DataFrame(changed, index=df.index)
    return df


def measured_at() -> str:
    """Now, as a row's ``measured_at``: UTC, ISO 8601, to the second."""
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def run_id(run_dir: Path) -> str:
    """The run folder relative to the working directory (unique across sweeps), else its path."""
    path = run_dir.resolve()
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def tidy(rows: Iterable[dict]) -> pd.DataFrame:
    """Rows as a frame with the schema's columns first (missing ones empty), extras after."""
    df = pd.DataFrame(list(rows))
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:  # added at once (one column at a time fragments the frame)
        df = pd.concat([df, pd.DataFrame({c: [None] * len(df) for c in missing}, index=df.index, dtype=object)], axis=1)
    extras = [c for c in df.columns if c not in COLUMNS]
    return typed(df[COLUMNS + extras].copy())


def temporary_twin(path: Path) -> Path:
    """Where ``path`` is written before it is renamed into place: a dot file (the report skips those),
    unique per process (a run folder has one writer at a time: harness/job/folder.py holds its lock)."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """``write`` a temporary file beside ``path``, then rename it over ``path``.

    A reader, or a run killed mid-write, sees the old file or the new one, never half of one.
    """
    tmp = temporary_twin(path)
    try:
        tmp.unlink(missing_ok=True)  # the name is kvbench's: a link planted there is never written through
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class TableWriteError(OSError):
    """A table could not be written (a full disk, a read-only folder, memory): one line, and no half-written pair."""


def _storable(values: pd.Series) -> bool:
    """An object column Parquet stores as it is: one type, no containers, no int beyond int64."""
    kinds = {type(v) for v in values.dropna()}
    if len(kinds) > 1 or kinds & {dict, list, tuple}:
        return False
    return not (kinds == {int} and any(not -2**63 <= v < 2**63 for v in values.dropna()))


# A spreadsheet reads a cell that starts with one of these as a formula (OWASP's CSV injection list).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
CSV_ESCAPE = "'"  # the prefix a spreadsheet shows as text, and that csv_cell_back takes off again


def csv_cell(value):
    """A text cell as the CSV holds it: one that a spreadsheet would run as a formula (or that starts with the
    escape itself, so that reading back is exact) gets a leading ``'``. Numbers are never touched."""
    if isinstance(value, str) and value.startswith((*FORMULA_STARTS, CSV_ESCAPE)):
        return CSV_ESCAPE + value
    return value


def csv_cell_back(value):
    """``csv_cell`` undone, for kvbench's own reading of a CSV it wrote."""
    return value[1:] if isinstance(value, str) and value.startswith(CSV_ESCAPE) else value


def _text_columns(df: pd.DataFrame) -> list:
    """The columns that may hold text: object columns and pandas' string columns (pandas 3 reads text as those)."""
    return [c for c in df.columns if df[c].dtype == object or pd.api.types.is_string_dtype(df[c].dtype)]


def csv_frame(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with every text cell passed through ``csv_cell``; numeric columns as they are."""
    text = _text_columns(df)
    if not text:
        return df
    out = df.copy()
    for col in text:
        out[col] = out[col].map(csv_cell, na_action="ignore")
    return out


def csv_frame_back(df: pd.DataFrame) -> pd.DataFrame:
    """A CSV kvbench wrote, read back: the escapes ``csv_cell`` added taken off the text columns."""
    for col in _text_columns(df):
        df[col] = df[col].map(csv_cell_back, na_action="ignore")
    return df


def write_table(df: pd.DataFrame, path_stem: Path) -> None:
    """``<stem>.csv`` and ``<stem>.parquet`` (object columns Parquet cannot hold as they are kept as strings).

    The CSV is the one a spreadsheet opens: a text cell that would run as a formula is escaped (``csv_cell``),
    and every text cell is quoted (numbers are not), so no line break inside a cell, a bare CR included (which
    minimal quoting leaves bare), can start a new row. The Parquet
    holds the values exactly. Both are written to temporary files first and renamed only once both are complete, so the
    two never disagree: a failure (disk full, memory) leaves the earlier pair, and raises
    ``TableWriteError`` with one line.
    """
    pq = df.copy()
    for col in pq.columns:
        if pq[col].dtype == object and not _storable(pq[col]):
            pq[col] = pq[col].map(lambda v: None if v is None else str(v))
    csv_path, pq_path = path_stem.with_suffix(".csv"), path_stem.with_suffix(".parquet")
    tmp_csv, tmp_pq = temporary_twin(csv_path), temporary_twin(pq_path)
    try:
        csv_frame(df).to_csv(tmp_csv, index=False, quoting=csv.QUOTE_NONNUMERIC, lineterminator="\n")
        pq.to_parquet(tmp_pq, index=False)
        os.replace(tmp_pq, pq_path)  # the Parquet first: a reader prefers it, and the CSV follows at once
        os.replace(tmp_csv, csv_path)
    except BaseException as e:
        for tmp in (tmp_csv, tmp_pq):
            tmp.unlink(missing_ok=True)
        if isinstance(e, Exception):
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise TableWriteError(f"{path_stem}.csv/.parquet could not be written: {type(e).__name__}"
                                  f"{': ' + first if first else ''}") from e
        raise


def write_run(run_dir: Path, rows: list[dict], tables: dict[str, pd.DataFrame] | None = None) -> pd.DataFrame:
    run_dir.mkdir(parents=True, exist_ok=True)
    df = tidy(rows)
    # Side tables first: a row is the mark of a finished impl (resume trusts it), so it goes last.
    for name, table in (tables or {}).items():
        write_table(table, run_dir / name)
    write_table(df, run_dir / "rows")
    return df


def write_json(path: Path, obj) -> None:
    text = json.dumps(obj, indent=2, default=str) + "\n"
    atomic_write(path, lambda tmp: tmp.write_text(text))


def write_tokens(path: Path, records: list[dict]) -> None:
    """One JSON object per line: impl, request_id, sample, prompt_ids, output_ids."""
    text = "".join(json.dumps(rec) + "\n" for rec in records)
    atomic_write(path, lambda tmp: tmp.write_text(text))
