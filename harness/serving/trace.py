"""workload=trace: request lengths (and arrival times) read from a CSV, JSONL or parquet file.

One request per row. Only the lengths and arrival times come from the file; token ids
stay seeded-random (harness/serving/workload.py), so a trace needs no tokenizer and leaks no text.
``workload.format=mooncake`` (the Mooncake FAST'25 traces; conf/workload/mooncake.yaml) also reads
each row's ``hash_ids``, the ids of its prompt's blocks, from which the token ids are drawn
(harness/serving/hash_blocks.py), and its timestamps in milliseconds (turned into seconds here).
The selected rows are put in arrival order (stable, so ties keep file order): request
ids then follow arrivals, whichever arrival process the run uses.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kvbench.harness.config import WorkloadConfig
from kvbench.harness.errors import ConfigError

READERS = {
    ".csv": lambda path: pd.read_csv(path),
    ".jsonl": lambda path: pd.read_json(path, lines=True),
    ".parquet": lambda path: pd.read_parquet(path),
}
# A request length read from a file: a whole token count up to int32's range (the kernels index with
# int32), checked on the file's value before any cast (1e30 would wrap to a negative int64).
MAX_TRACE_TOKENS = 2**31 - 1
# A trace is read whole into memory: the largest public ones (BurstGPT's 1.4 M rows) are a few hundred MB.
TRACE_LIMIT = 2 * 2**30
MAX_ARRIVAL_S = 1e9  # about 32 years: beyond it a trace's time column is not seconds
# Its own random stream for sample=random, apart from the token ids' and the arrivals'.
SAMPLE_STREAM = 0x5A3B1E


@dataclass(frozen=True)
class Trace:
    """The selected rows of a trace file, in arrival order."""

    prompt_lens: np.ndarray  # int64, >= 1
    output_lens: np.ndarray  # int64, >= 1
    arrival_s: np.ndarray | None  # float64 as in the file (unshifted, unscaled); None without the column
    sha256: str  # of the file's bytes, recorded in every row
    hash_ids: list[list[int]] | None = None  # format=mooncake: each selected row's prompt block ids


MS_PER_S = 1000.0  # format=mooncake: the timestamp column is in milliseconds


def _hash_ids(df: pd.DataFrame, column: str, path: Path) -> list[list[int]]:
    """The column's lists of whole, non-negative block ids (as JSONL or parquet hold lists)."""
    if column not in df.columns:
        raise ConfigError(f"workload.columns.hash_ids={column!r} is not a column of workload.path={str(path)!r}; "
                          f"columns: {', '.join(map(str, df.columns))}")
    out = []
    for row, ids in enumerate(df[column]):
        values = list(ids) if isinstance(ids, (list, tuple, np.ndarray)) else None
        if values is None or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 0
                                     for v in values):
            raise ConfigError(f"workload.columns.hash_ids={column!r} must hold lists of whole ids >= 0 "
                              f"(workload.format=mooncake); row {row + 1} of workload.path={str(path)!r} "
                              f"holds {ids!r}")
        out.append([int(v) for v in values])
    return out


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _read_frame(path: Path) -> pd.DataFrame:
    reader = READERS.get(path.suffix.lower())
    if reader is None:
        raise ConfigError(f"workload.path={str(path)!r} has an unknown file type {path.suffix!r}; "
                          f"allowed: {', '.join(READERS)}")
    if not path.is_file():  # a FIFO or a device is no file either: never opened, so it cannot block the run
        raise ConfigError(f"workload.path={str(path)!r}: no such file")
    if (size := path.stat().st_size) > TRACE_LIMIT:
        raise ConfigError(f"workload.path={str(path)!r} is {size / 2**30:.1f} GiB, over the {TRACE_LIMIT / 2**30:g} GiB "
                          "kvbench reads as a trace (SECURITY.md); select its rows into a smaller file")
    try:
        return reader(path)
    except Exception as e:  # noqa: BLE001 - a malformed file of any kind is the user's input
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"workload.path={str(path)!r} could not be read as {path.suffix[1:]}: {first_line}") from e


def _numeric(df: pd.DataFrame, key: str, column: str, path: Path) -> np.ndarray:
    """The column as float64; a missing column or a value that is not a finite number is an error."""
    if column not in df.columns:
        raise ConfigError(f"workload.columns.{key}={column!r} is not a column of workload.path={str(path)!r}; "
                          f"columns: {', '.join(map(str, df.columns))}")
    raw = df[column]
    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    bad = np.flatnonzero(~np.isfinite(values))
    if raw.dtype == bool or bad.size:
        row = int(bad[0]) if bad.size else 0
        raise ConfigError(f"workload.columns.{key}={column!r} must hold numbers; "
                          f"row {row + 1} of workload.path={str(path)!r} holds {raw.iloc[row]!r}")
    return values


def _lengths(df: pd.DataFrame, key: str, column: str, path: Path) -> np.ndarray:
    values = _numeric(df, key, column, path)
    bad = np.flatnonzero((values < 1) | (values != np.floor(values)) | (values > MAX_TRACE_TOKENS))
    if bad.size:
        row = int(bad[0])
        raise ConfigError(f"workload.columns.{key}={column!r} must hold whole token counts from 1 to "
                          f"{MAX_TRACE_TOKENS}; row {row + 1} of workload.path={str(path)!r} holds {values[row]:g}")
    return values.astype(np.int64)  # exact: every value is a whole number within int32


def _arrivals(df: pd.DataFrame, column: str, path: Path) -> np.ndarray:
    values = _numeric(df, "arrival_s", column, path)
    bad = np.flatnonzero(np.abs(values) > MAX_ARRIVAL_S)
    if bad.size:
        row = int(bad[0])
        raise ConfigError(f"workload.columns.arrival_s={column!r} must hold seconds within {MAX_ARRIVAL_S:g}; "
                          f"row {row + 1} of workload.path={str(path)!r} holds {values[row]:g}")
    return values


def _select(rows: int, count: int, how: str, seed: int) -> np.ndarray:
    """Row indices, in file order: the first ``count`` rows, or ``count`` drawn without replacement."""
    if how == "head":
        return np.arange(count)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, SAMPLE_STREAM])))
    return np.sort(rng.choice(rows, size=count, replace=False))


def read_trace(cfg: WorkloadConfig, count: int | None, seed: int) -> Trace:
    """``count`` rows of ``cfg.path`` (None: every row), chosen by ``cfg.sample`` and put in arrival order."""
    path = Path(cfg.path)
    df = _read_frame(path)
    cols = cfg.columns
    prompt = _lengths(df, "prompt_len", cols.prompt_len, path)
    output = _lengths(df, "output_len", cols.output_len, path)
    arrival = _arrivals(df, cols.arrival_s, path) if cols.arrival_s in df.columns else None
    mooncake = cfg.format == "mooncake"
    if mooncake and arrival is not None:
        arrival = arrival / MS_PER_S
    hash_ids = _hash_ids(df, cols.hash_ids, path) if mooncake else None
    if len(df) == 0:
        raise ConfigError(f"workload.path={str(path)!r} has no rows: a trace needs at least one request")
    if count is None:
        count = len(df)
    if count > len(df):
        raise ConfigError(f"workload.num_requests: {count} requests asked for, but workload.path={str(path)!r} "
                          f"has {len(df)} rows (unset, workload.num_requests takes every row; capacity also "
                          f"draws the largest scenario.concurrency_points)")
    rows = _select(len(df), count, cfg.sample, seed)
    if arrival is not None:
        rows = rows[np.argsort(arrival[rows], kind="stable")]
    return Trace(prompt[rows], output[rows], None if arrival is None else arrival[rows], file_sha256(path),
                 [hash_ids[r] for r in rows] if hash_ids is not None else None)
