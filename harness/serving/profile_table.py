"""A step profile as a tidy table (``profile.csv`` / ``profile.parquet`` in its run folder), and back.

One row per profiled point of one impl: ``kind`` (decode | prefill | after_idle | after_busy), ``batch`` and ``context``
(decode: sequences, and the mean KV tokens each step's attention read per sequence), ``tokens``
(prefill: prompt tokens the forward computed), ``seconds`` (the median step), ``seconds_p10``,
``seconds_p90`` and ``samples``; ``attention_seconds`` (the median step's time in the cache's
attention: K/V writes and kernel, harness/measure/attention_timer.py) and ``attention_share`` (the
median over steps of that time over the step's). The clock reads only ``seconds``; the attention
columns say how much of a step is the cache's, and may be absent in a table made before them.
``after_idle`` rows (absent in a table made before them) hold what the steps after the engine slept cost
against the points' prices: ``place`` (the step's place since the sleep: 0 the prefill, then the first decode
place of each bin) and ``factor`` (the median of its steps' time over their price), with the bin's median step
in ``seconds`` (harness/serving/after_idle.py); ``after_busy`` rows the same after a busy prefill (one run between
decode steps, with no sleep before it: place 0 that prefill), absent in a table made before them.
Each row also records what measured it (``PROVENANCE``: model, dtype, KV store, kernel, device and
kvbench's commit), absent in a table made before that record; harness/serving/clocks.py compares it
with the run a profile prices. ``clock_profile=PATH`` (a run folder holding the table, or the
table itself) prices a simulated run's steps from it (harness/serving/profiled_clock.py).

A results folder is data: the table is read as numbers, checked (``checked_table``: every value in
its column's range, no point twice), never cast into range, and never run. A refusal is one line
naming the file, the row (data rows counted from 1, the header not counted), the column, the value
and what the column allows.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import pandas as pd

from kvbench.harness.config import Config
from kvbench.harness.errors import ConfigError
from kvbench.harness.measure.metrics import percentile
from kvbench.harness.serving.after_idle import MAX_FACTOR, MIN_FACTOR, AfterIdle
from kvbench.harness.serving.profiled_clock import ProfiledClock, ProfilePoints, prefill_path_s

PROFILE = "profile"  # the table's name in a run folder
PROFILE_COLUMNS = ["impl", "kind", "batch", "context", "tokens", "seconds", "seconds_p10", "seconds_p90", "samples",
                   "attention_seconds", "attention_share", "place", "factor"]
KINDS = ("decode", "prefill", "after_idle", "after_busy")
# The columns each kind of point needs (the others of its row may be empty).
NEEDED = {"decode": ("batch", "context", "seconds"), "prefill": ("tokens", "seconds"),
          "after_idle": ("place", "factor"), "after_busy": ("place", "factor")}
# A point's identity: a table holding one twice would have the last row win silently.
POINT_KEYS = {"decode": ("batch", "context"), "prefill": ("tokens",), "after_idle": ("place",),
              "after_busy": ("place",)}

# One step's plausible time. 100 ns is far below any forward pass (a GPU kernel launch alone takes a few us, the
# engine's host work per step tens of us), so a time below it is a zero or a unit slip (ns written as s); 1000 s
# for one step is beyond any grid anyone measures (each point times several steps in several passes), so a time
# above it is a unit slip (us or ms written as s) or garbage such as 1e300.
MIN_STEP_S, MAX_STEP_S = 1e-7, 1e3


@dataclass(frozen=True)
class Bound:
    """What a numeric column may hold: a finite number in [low, high] ((low, high] with ``low_open``)."""

    low: float
    high: float
    whole: bool = False
    low_open: bool = False
    said: str = ""  # what the column holds, where the default wording does not fit

    def holds(self, values: pd.Series) -> pd.Series:
        v = values.to_numpy(dtype=float)
        above = v > self.low if self.low_open else v >= self.low
        ok = np.isfinite(v) & above & (v <= self.high)
        if self.whole:
            ok &= np.isfinite(v) & (np.mod(np.where(np.isfinite(v), v, 0.0), 1.0) == 0.0)
        return pd.Series(ok, index=values.index)

    def text(self) -> str:
        if self.said:
            return self.said
        if self.whole:
            top = "2**53" if self.high == 2**53 else f"{int(self.high)}"
            return f"a whole number from {self.low:g} to {top}"
        if self.low_open and math.isinf(self.high):
            return f"a finite number > {self.low:g}"
        return f"a positive, finite measurement in [{self.low:g}, {self.high:g}] s (one step's time)"


STEP = Bound(MIN_STEP_S, MAX_STEP_S)
# Up to 2**53 every whole float is exact, so a count a CSV gives as a float (1.0) is the count written.
COUNT = Bound(1, 2**53, whole=True)
BOUNDS = {"batch": COUNT, "tokens": COUNT, "samples": COUNT,
          "context": Bound(0, math.inf, low_open=True),  # a mean of KV tokens read per sequence
          "seconds": STEP, "seconds_p10": STEP, "seconds_p90": STEP, "attention_seconds": STEP,
          # an after-idle row: the step's place since the engine slept (0: the prefill), and its price factor
          "place": Bound(0, 2**53, whole=True),
          "factor": Bound(MIN_FACTOR, MAX_FACTOR, said=f"a price factor in [{MIN_FACTOR:g}, {MAX_FACTOR:g}]")}


@dataclass(frozen=True)
class Provenance:
    """What measured a profile: the settings that change a step's time, and the code that timed it."""

    model: str | None
    dtype: str | None
    kv_dtype: str | None  # the KV store: the model's dtype where kv_dtype=auto
    kv_scale: str | None  # a quantized store's scales; None for a float store
    kernel: str | None  # the impl's decode-attention kernel (impl.kernel)
    device_slug: str | None
    device_name: str | None  # the GPU's name, or the CPU's
    git_sha: str | None


PROVENANCE = [f.name for f in fields(Provenance)]


def provenance_of(cfg: Config, kernel: str | None, device_slug: str | None, device_name: str | None,
                  git_sha: str | None) -> Provenance:
    """The provenance of a run of ``cfg`` with ``kernel``: ``kv_dtype=auto`` stores the model's dtype, so it is
    recorded as that dtype (the same store, the same record), and a float store has no scales."""
    quantized = cfg.kv_dtype != "auto"
    return Provenance(cfg.model.name, cfg.dtype, cfg.kv_dtype if quantized else cfg.dtype,
                      cfg.kv_scale if quantized else None, kernel, device_slug, device_name, git_sha)


def _quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile (in [0, 1]) as one measured sample, numpy's ``nearest`` method (index
    (n - 1) * q rounded, half to even): a profile's p10/p90 are steps that were timed, not points
    between two, so the spread a priced step is drawn within is one the device showed. kvbench's
    only percentile that is not linear."""
    return percentile(values, q * 100, method="nearest")


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


def profile_frame(points: list[dict], made_by: Provenance) -> pd.DataFrame:
    """The table of ``points``, each row recording ``made_by`` (a row alone says what measured it)."""
    return pd.DataFrame(points, columns=PROFILE_COLUMNS).assign(**asdict(made_by))


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


def shown(value: object, quote: bool = True) -> str:
    """A cell of an untrusted table as a message shows it: on one line and short (text in quotes, unless
    ``quote`` is off and it is plain)."""
    text = repr(value) if quote and isinstance(value, str) else str(value)
    return text if len(text) <= 60 and text.isprintable() else repr(text[:60])


def _first(mask: pd.Series) -> int | None:
    hits = np.flatnonzero(mask.to_numpy(dtype=bool))
    return int(hits[0]) if len(hits) else None


def _numbers(raw: pd.Series, col: str, source: str) -> pd.Series:
    """``raw`` as floats (empty cells NaN); a cell that is not a number (text, a bool) is refused, never cast."""
    flags = raw.map(lambda v: isinstance(v, (bool, np.bool_)))
    values = pd.to_numeric(raw.where(~flags.astype(bool)), errors="coerce").astype(float)
    bad = _first(raw.notna() & values.isna())
    if bad is not None:
        raise ConfigError(f"clock_profile={source}: row {bad + 1}, column {col}: {shown(raw.iloc[bad])} is not a "
                          f"number ({col} must be {BOUNDS[col].text()})")
    return values


def checked_table(df: pd.DataFrame, source: str) -> pd.DataFrame:
    """``df`` with its numeric columns as floats, once every row is a point the clock may price: an impl, a
    known kind, the columns its kind needs, every number in its column's range (counts whole), p10 <= the
    median <= p90, and no point twice. The first problem is refused, in one line."""
    out = df.reset_index(drop=True).copy()
    bad = _first(out["impl"].isna() | (out["impl"].astype(str).str.strip() == ""))
    if bad is not None:
        raise ConfigError(f"clock_profile={source}: row {bad + 1}, column impl is empty (an impl's name)")
    out["impl"] = out["impl"].astype(str)
    bad = _first(~out["kind"].isin(KINDS))
    if bad is not None:
        raise ConfigError(f"clock_profile={source}: row {bad + 1}, column kind: {shown(out['kind'].iloc[bad])} "
                          f"is not a kind of point (allowed: {', '.join(KINDS)})")
    for col in [c for c in BOUNDS if c in out.columns]:
        out[col] = _numbers(out[col], col, source)
    for kind, needed in NEEDED.items():
        for col in needed:
            if col not in out.columns:  # a table made before the kind: fine while it holds none of its rows
                bad = _first(out["kind"] == kind)
                if bad is not None:
                    raise ConfigError(f"clock_profile={source}: row {bad + 1}, a {kind} point, has no {col} "
                                      f"column ({col} must be {BOUNDS[col].text()})")
                continue
            bad = _first((out["kind"] == kind) & out[col].isna())
            if bad is not None:
                raise ConfigError(f"clock_profile={source}: row {bad + 1}, a {kind} point, has no {col} "
                                  f"({col} must be {BOUNDS[col].text()})")
    for col in [c for c in BOUNDS if c in out.columns]:
        bad = _first(out[col].notna() & ~BOUNDS[col].holds(out[col]))
        if bad is not None:
            raise ConfigError(f"clock_profile={source}: row {bad + 1}, column {col}: {shown(out[col].iloc[bad])} "
                              f"is not {BOUNDS[col].text()}")
    for lo, hi in [("seconds_p10", "seconds"), ("seconds", "seconds_p90")]:
        if lo in out.columns and hi in out.columns:
            bad = _first(out[lo].notna() & out[hi].notna() & (out[lo] > out[hi]))
            if bad is not None:
                raise ConfigError(f"clock_profile={source}: row {bad + 1}: {lo}={out[lo].iloc[bad]:g} > "
                                  f"{hi}={out[hi].iloc[bad]:g} (a point's seconds_p10 <= seconds <= seconds_p90)")
    for kind, keys in POINT_KEYS.items():
        sub = out[out["kind"] == kind]
        twice = sub[sub.duplicated(["impl", *keys], keep=False)]
        if len(twice):
            first = twice.iloc[0]
            rows = [i + 1 for i in twice.index if all(out.at[i, k] == first[k] for k in ("impl", *keys))]
            point = ", ".join(f"{k} {first[k]:g}" for k in keys)
            raise ConfigError(f"clock_profile={source}: rows {', '.join(map(str, rows))} are the same point "
                              f"(impl {shown(first['impl'])}, {kind}, {point}); a table holds each point once")
    return out


def read_profile_table(path: Path) -> tuple[pd.DataFrame, str]:
    """The checked table at ``path`` (a run folder, or the table) and its file's path, as messages name it."""
    from kvbench.harness.untrusted import read_table

    table = _table_path(path)
    try:  # a results folder is someone else's data: read as untrusted (regular files, size limits)
        df = read_table(table)
    except Exception as e:  # noqa: BLE001 - any unreadable file is one line
        said = (str(e).splitlines() or [""])[0][:200]  # one line, whatever the reader raised
        raise ConfigError(f"clock_profile={table}: cannot read it ({type(e).__name__}: {said})") from None
    missing = [c for c in ("impl", "kind", "batch", "context", "tokens", "seconds") if c not in df.columns]
    if missing:
        raise ConfigError(f"clock_profile={table}: not a profile table (no column {', '.join(missing)})")
    return checked_table(df, str(table)), str(table)


def _cell(value: object) -> str | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) or str(value) == "" else str(value)


def recorded_provenance(df: pd.DataFrame, impl: str, source: str) -> Provenance | None:
    """What measured ``impl``'s rows, or None for a table made before profiles recorded it (none of the columns).
    The rows must agree (a profile is of one setting), but for the commit: a resumed profile job may have run
    its impls at two commits, and a commit only ever makes a note."""
    if not any(c in df.columns for c in PROVENANCE):
        return None
    rows = df[df["impl"].astype(str) == impl]
    values: dict[str, str | None] = {}
    for col in PROVENANCE:
        seen = sorted({_cell(v) for v in rows[col]}, key=str) if col in rows.columns else [None]
        if len(seen) > 1 and col != "git_sha":
            raise ConfigError(f"clock_profile={source}: the rows of impl {shown(impl)} disagree on {col} "
                              f"({', '.join(shown(v) for v in seen)}): a profile is of one setting (two tables "
                              "joined into one?)")
        values[col] = seen[0] if len(seen) == 1 else ",".join(v for v in seen if v)
    return Provenance(**values)


def clock_from_table(df: pd.DataFrame, impl: str, source: str) -> ProfiledClock:
    """The clock of ``impl``'s rows; one line naming the problem (and the impls there are) otherwise."""
    df = checked_table(df, source)
    impls = sorted(df["impl"].unique())
    if impl not in impls:
        profiled = ", ".join(shown(i, quote=False) for i in impls) or "nothing"
        raise ConfigError(f"clock_profile={source} has no profile of impl {shown(impl)}; it profiles: {profiled} "
                          "(clock_profile_impl=NAME picks one)")
    rows = df[df["impl"] == impl]
    decode = rows[rows["kind"] == "decode"]
    prefill = rows[rows["kind"] == "prefill"]
    attention = prefill["attention_seconds"] if "attention_seconds" in prefill else [None] * len(prefill)
    points = ProfilePoints(tuple((int(b), float(c), float(s)) for b, c, s in
                                 zip(decode["batch"], decode["context"], decode["seconds"])),
                           tuple((int(t), float(s)) for t, s in zip(prefill["tokens"], prefill["seconds"])),
                           prefill_path_s((int(t), None if pd.isna(a) else float(a))
                                          for t, a in zip(prefill["tokens"], attention)),
                           _after_idle(rows[rows["kind"] == "after_idle"], rows[rows["kind"] == "after_busy"], impl,
                                       source))
    if not points.decode or not points.prefill:
        raise ConfigError(f"clock_profile={source}: impl {shown(impl)} needs decode and prefill points "
                          f"(it has {len(points.decode)} and {len(points.prefill)})")
    return ProfiledClock(points)


def _after_idle(rows: pd.DataFrame, busy: pd.DataFrame, impl: str, source: str) -> AfterIdle | None:
    """An impl's after-idle rows (and after-busy ones) as factors (harness/serving/after_idle.py); None where it has
    none. Place 0 is the prefill's; the decode places, ascending from 1, each hold up to the next."""
    if rows.empty:
        if not busy.empty:
            raise ConfigError(f"clock_profile={source}: impl {shown(impl)} has after_busy rows but no after_idle "
                              "ones: the busy curve is the after-idle one's second half")
        return None
    curves = []
    for kind, part, what in (("after_idle", rows, "after a sleep"), ("after_busy", busy, "run between decodes")):
        by_place = {int(p): float(f) for p, f in zip(part["place"], part["factor"])}
        if part is busy and part.empty:
            curves.append(None)
            continue
        if 0 not in by_place or 1 not in by_place:
            raise ConfigError(f"clock_profile={source}: impl {shown(impl)}'s {kind} rows need place 0 (the prefill "
                              f"{what}) and place 1 (the first decode step); it has places "
                              f"{', '.join(str(p) for p in sorted(by_place))}")
        curves.append(by_place)
    return AfterIdle.from_places(curves[0], curves[1])


def load_profile(path: str, impl: str) -> tuple[ProfiledClock, Provenance | None, str]:
    """The clock of ``impl``'s profile at ``path``, what measured it (None: not recorded) and the table's file."""
    df, source = read_profile_table(Path(path))
    return clock_from_table(df, impl, source), recorded_provenance(df, impl, source), source
