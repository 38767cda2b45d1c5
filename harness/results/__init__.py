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

# The columns, their types and meanings are declared once, in harness/results/schema.py; the name lists
# below are derived from it (in the rows' order: identifiers, fingerprint, status, metrics).
from kvbench.harness.results.schema import (
    BOOLEANS, COLUMNS, COUNTS, FINGERPRINT, IDENTIFIERS, METRICS, SCHEMA, STATUS, TEXT_COLUMNS, TEXT_METRICS, key_columns,
)

# What a row's ``status`` may say: measured, out of memory, failed, not applicable, stopped by a signal.
STATUSES = ("ok", "oom", "error", "skipped", "interrupted")
# What every row names, whatever its status (the report reads no row without them).
REQUIRED = ("scenario", "status")


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
    # read from ``dtypes``, not column by column: a Series per column cost the report 6 of its 53 s
    return [c for c, t in df.dtypes.items() if t == object or pd.api.types.is_string_dtype(t)]


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
    text = _text_columns(df)
    if not text:
        return df
    # Only the columns that hold an escaped cell are mapped (most hold none): a map per text column was
    # most of the time the report spent reading the hundreds of small CSVs of a results folder.
    cells = df[text].to_numpy(dtype=object).T
    for col, column in zip(text, cells):
        if any(isinstance(v, str) and v.startswith(CSV_ESCAPE) for v in column):
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
