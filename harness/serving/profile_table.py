"""A step profile as a tidy table (``profile.csv`` / ``profile.parquet`` in its run folder), and back.

One row per profiled point of one impl: ``kind`` (decode | prefill), ``batch`` and ``context``
(decode: sequences, and the mean KV tokens each step's attention read per sequence), ``tokens``
(prefill: prompt tokens the forward computed), ``seconds`` (the median step), ``seconds_p10``,
``seconds_p90`` and ``samples``; ``attention_seconds`` (the median step's time in the cache's
attention: K/V writes and kernel, harness/measure/attention_timer.py) and ``attention_share`` (the
median over steps of that time over the step's). The clock reads only ``seconds``; the attention
columns say how much of a step is the cache's, and may be absent in a table made before them.
``clock_profile=PATH`` (a run folder holding the table, or the
table itself) prices a simulated run's steps from it (harness/serving/profiled_clock.py).

A results folder is data: the table is read as numbers, checked, and never run.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pandas as pd

from harness.errors import ConfigError
from harness.serving.profiled_clock import ProfiledClock, ProfilePoints

PROFILE = "profile"  # the table's name in a run folder
PROFILE_COLUMNS = ["impl", "kind", "batch", "context", "tokens", "seconds", "seconds_p10", "seconds_p90", "samples",
                   "attention_seconds", "attention_share"]


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def point(impl: str, kind: str, seconds: list[float], batch: int | None = None, context: float | None = None,
          tokens: int | None = None, attention: list[float] | None = None) -> dict:
    """One profiled point from its samples (seconds of each measured step, and of its attention if timed)."""
    if attention is not None and len(attention) != len(seconds):
        raise ValueError(f"{len(attention)} attention samples for {len(seconds)} steps")
    timed = attention is not None and len(attention) > 0
    return {"impl": impl, "kind": kind, "batch": batch, "context": context, "tokens": tokens,
            "seconds": statistics.median(seconds), "seconds_p10": _quantile(seconds, 0.1),
            "seconds_p90": _quantile(seconds, 0.9), "samples": len(seconds),
            "attention_seconds": statistics.median(attention) if timed else None,
            "attention_share": statistics.median(a / s for a, s in zip(attention, seconds) if s > 0) if timed else None}


def profile_frame(points: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(points, columns=PROFILE_COLUMNS)


def _table_path(path: Path) -> Path:
    if path.is_dir():
        for name in (f"{PROFILE}.parquet", f"{PROFILE}.csv"):
            if (path / name).exists():
                return path / name
        raise ConfigError(f"clock_profile={path}: the folder holds no {PROFILE}.parquet or {PROFILE}.csv "
                          "(make one with scenario=profile)")
    if not path.exists():
        raise ConfigError(f"clock_profile={path}: no such file or folder (a scenario=profile run folder, "
                          f"or its {PROFILE}.csv / {PROFILE}.parquet)")
    return path


def read_profile_table(path: Path) -> pd.DataFrame:
    table = _table_path(path)
    try:
        df = pd.read_parquet(table) if table.suffix == ".parquet" else pd.read_csv(table)
    except Exception as e:  # noqa: BLE001 - any unreadable file is one line
        raise ConfigError(f"clock_profile={table}: cannot read it ({type(e).__name__}: {e})") from None
    missing = [c for c in ("impl", "kind", "batch", "context", "tokens", "seconds") if c not in df.columns]
    if missing:
        raise ConfigError(f"clock_profile={table}: not a profile table (no column {', '.join(missing)})")
    return df


def clock_from_table(df: pd.DataFrame, impl: str, source: str) -> ProfiledClock:
    """The clock of ``impl``'s rows; one line naming the problem (and the impls there are) otherwise."""
    impls = sorted(df["impl"].dropna().astype(str).unique())
    if impl not in impls:
        raise ConfigError(f"clock_profile={source} has no profile of impl {impl!r}; it profiles: "
                          f"{', '.join(impls) or 'nothing'} (clock_profile_impl=NAME picks one)")
    rows = df[df["impl"].astype(str) == impl]

    def numbers(kind: str, cols: list[str]) -> list[tuple]:
        sub = rows[rows["kind"] == kind]
        out = []
        for rec in sub[cols].itertuples(index=False):
            values = [float(v) for v in rec]
            if not all(math.isfinite(v) for v in values) or values[-1] < 0 or any(v <= 0 for v in values[:-1]):
                raise ConfigError(f"clock_profile={source}: a {kind} point of {impl} is not a positive, "
                                  f"finite measurement: {dict(zip(cols, rec))}")
            out.append(tuple(values))
        return out

    decode = [(int(b), c, s) for b, c, s in numbers("decode", ["batch", "context", "seconds"])]
    prefill = [(int(t), s) for t, s in numbers("prefill", ["tokens", "seconds"])]
    if not decode or not prefill:
        raise ConfigError(f"clock_profile={source}: impl {impl} needs decode and prefill points "
                          f"(it has {len(decode)} and {len(prefill)})")
    return ProfiledClock(ProfilePoints(tuple(decode), tuple(prefill)))


def load_clock(path: str, impl: str) -> ProfiledClock:
    return clock_from_table(read_profile_table(Path(path)), impl, path)
