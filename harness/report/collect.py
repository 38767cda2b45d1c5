"""Find run folders, concatenate their rows and points tables, and read the commands that made them."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from harness.results import COLUMNS, METRICS, TEXT_METRICS

# Columns that hold numbers; a run folder's CSV or an all-None Parquet column may have typed
# them as text or object, and concatenation must not turn a missing value into anything but NaN.
NUMERIC = [
    "block_size", "batch", "max_seq_len", "num_requests", "prompt_len", "output_len",
    "shared_prefix_len", "n", "seed", "repeat", "gpu_count", "gpu_memory_bytes", "cpu_count",
    *[m for m in METRICS if m not in TEXT_METRICS],  # kernel and max_concurrency columns included
    # capacity points
    "concurrency", "kv_bytes_reserved", "kv_bytes_used", "budget_kv_bytes",
]


@dataclass
class RunCommand:
    scenario: str
    run_dir: str
    command: str


@dataclass
class Collection:
    rows: pd.DataFrame
    points: pd.DataFrame
    commands: list[RunCommand] = field(default_factory=list)
    run_dirs: list[str] = field(default_factory=list)


def find_run_dirs(root: Path) -> list[Path]:
    """Folders holding rows.parquet or rows.csv, sorted (the all_runs tables are not run folders)."""
    found = {p.parent for pattern in ("rows.parquet", "rows.csv") for p in root.rglob(pattern)}
    return sorted(d for d in found if not any(part.startswith(".") for part in d.relative_to(root).parts))


def read_table(run_dir: Path, stem: str) -> pd.DataFrame | None:
    """``<stem>.parquet``, falling back to ``<stem>.csv``; None when neither exists."""
    pq, csv = run_dir / f"{stem}.parquet", run_dir / f"{stem}.csv"
    if pq.exists():
        return pd.read_parquet(pq)
    if csv.exists():
        try:
            return pd.read_csv(csv)
        except pd.errors.EmptyDataError:  # a job killed before it wrote a row
            return pd.DataFrame()
    return None


def _label(root: Path, run_dir: Path) -> str:
    """The run folder as ``<root name>/<relative path>``: stable whatever the working directory."""
    rel = run_dir.relative_to(root).as_posix()
    name = root.resolve().name
    return name if rel == "." else f"{name}/{rel}"


def numeric(df: pd.DataFrame) -> pd.DataFrame:
    for col in NUMERIC:
        if col in df.columns:
            df[col] = pd.to_numeric(df[col], errors="coerce")
    return df


def concat(frames: list[pd.DataFrame], first: list[str]) -> pd.DataFrame:
    """One frame with every column any frame has (``first`` leading); a value a frame lacks stays empty."""
    columns = list(first)
    for f in frames:
        columns += [c for c in f.columns if c not in columns]
    if not frames:
        return pd.DataFrame(columns=columns)
    # All-empty columns are given their type afterwards: concatenating them would be ambiguous.
    frames = [f.dropna(axis=1, how="all") for f in frames]
    df = pd.concat(frames, ignore_index=True, sort=False)
    return numeric(df.reindex(columns=columns))


def _load_yaml(path: Path):
    """A YAML file, or None without PyYAML (the GPU machine may lack it) or on a malformed file."""
    try:
        import yaml
    except ImportError:
        return None
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None


def _overrides(cfg, group: str) -> list[str]:
    try:
        items = cfg["hydra"]["overrides"][group] or []
    except (KeyError, TypeError):
        return []
    return [str(i) for i in items if not str(i).startswith("hydra.mode=")]  # -m already says it


def _task_overrides(path: Path) -> list[str] | None:
    """``.hydra/overrides.yaml`` (``- key=value`` lines); read line by line when PyYAML is missing."""
    if not path.exists():
        return None
    items = _load_yaml(path)
    if items is None:
        items = [ln[2:].strip() for ln in path.read_text().splitlines() if ln.startswith("- ")]
    return [str(i) for i in items]


def _command(overrides: list[str], multirun: bool) -> str:
    return " ".join(["python -m harness", *(["-m"] if multirun else []), *(shlex.quote(o) for o in overrides)])


def _commands(root: Path, run_dirs: list[Path], rows: dict[Path, pd.DataFrame]) -> list[RunCommand]:
    """One command per single run, one per sweep (its multirun.yaml) covering all its jobs.

    The task overrides come first, then Hydra's own (where the output went)."""
    out, sweeps_seen = [], set()
    for d in run_dirs:
        df = rows[d]
        scenario = str(df["scenario"].dropna().iloc[0]) if "scenario" in df and df["scenario"].notna().any() else "?"
        sweep_file = d.parent / "multirun.yaml"
        if sweep_file.exists():
            if d.parent not in sweeps_seen:
                sweeps_seen.add(d.parent)
                cfg = _load_yaml(sweep_file)
                if cfg is not None:
                    cmd = _command(_overrides(cfg, "task") + _overrides(cfg, "hydra"), multirun=True)
                    out.append(RunCommand(scenario, _label(root, d.parent), cmd))
            continue
        task = _task_overrides(d / ".hydra" / "overrides.yaml")
        if task is not None:
            hydra_cfg = _load_yaml(d / ".hydra" / "hydra.yaml") if (d / ".hydra" / "hydra.yaml").exists() else None
            out.append(RunCommand(scenario, _label(root, d), _command(task + _overrides(hydra_cfg, "hydra"), False)))
    return out


def collect(roots: list[Path]) -> Collection:
    rows_frames, point_frames, commands, labels = [], [], [], []
    for root in roots:
        dirs = find_run_dirs(root)
        per_dir = {}
        for d in dirs:
            label = _label(root, d)
            rows = read_table(d, "rows")
            rows["run_dir"] = label
            per_dir[d] = rows
            rows_frames.append(rows)
            labels.append(label)
            points = read_table(d, "points")
            if points is not None:
                points["run_dir"] = label
                point_frames.append(points)
        commands += _commands(root, dirs, per_dir)
    rows = concat(rows_frames, ["run_dir", *COLUMNS])
    points = concat(point_frames, ["run_dir"])
    return Collection(rows, points, commands, labels)


def ok_rows(df: pd.DataFrame, scenario: str | None = None) -> pd.DataFrame:
    """Rows that measured something: failed rows stay in the table but are never plotted."""
    sel = df["status"] == "ok"
    if scenario is not None:
        sel &= df["scenario"] == scenario
    return df[sel].copy()


def unique_points(points: pd.DataFrame) -> pd.DataFrame:
    """Points tables without repeats: every job of a sweep writes the same impl-independent table."""
    if points.empty:
        return points
    key = [c for c in points.columns if c not in ("run_dir", "run_id", "kv_bytes_reserved", "kv_bytes_used")]
    return points.drop_duplicates(subset=key, keep="first").reset_index(drop=True)
