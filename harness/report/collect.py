"""Find run folders, concatenate their rows and side tables, and read the commands that made them.

One bad file never sinks the report: an unreadable Parquet table is read from its CSV twin, and
what cannot be read at all, or a folder that holds a config but no rows, is listed instead."""

from __future__ import annotations

import os
import shlex
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from kvbench.harness.report.external import ExternalDefaults, read_external
from kvbench.harness.untrusted import YAML_LIMIT, UntrustedError, read_text, read_yaml
from kvbench.harness.untrusted import read_table as read_untrusted_table
from kvbench.harness.results import BOOLEANS, COLUMNS, METRICS, REQUIRED, STATUSES, TEXT_METRICS, typed

BOOLEAN = list(BOOLEANS)  # true/false columns (harness/results): a CSV gives them back as text
# Columns that hold numbers; a run folder's CSV or an all-None Parquet column may have typed
# them as text or object, and concatenation must not turn a missing value into anything but NaN.
NUMERIC = [
    "block_size", "batch", "max_seq_len", "num_requests", "prompt_len", "output_len",
    "shared_prefix_len", "n", "seed", "repeat", "gpu_count", "gpu_memory_bytes", "cpu_count",
    # kernel, max_concurrency, service (arrival, latency, SLO) and max_rate columns included
    *[m for m in METRICS if m not in TEXT_METRICS and m not in BOOLEAN],
    # capacity points
    "concurrency", "kv_bytes_reserved", "kv_bytes_used", "budget_kv_bytes",
    # rate_probes and steps side tables
    "rate_rps", "t_s", "running", "waiting", "tokens", "kv_used_bytes", "kv_reserved_bytes",
    # a validating profile job's wall steps: the profile's price, the KV read, the place since the engine slept
    "price_s", "kv_tokens_read", "place",
]
# The side tables the report draws from (a run's requests table is for the user; no plot reads it).
SIDE_TABLES = ("points", "rate_probes", "steps")


@dataclass
class RunCommand:
    scenario: str
    run_dir: str
    command: str


@dataclass
class ReadProblem:
    """A table file that could not be read: what was read instead (its CSV twin), or nothing."""
    label: str  # <run folder label>/<file name>, as REPORT.md names it
    path: Path
    reason: str
    used: str | None = None  # the twin's file name when it was read instead
    rows_left_out: int = 0  # the table was read, but these of its rows are not kvbench rows

    def line(self) -> str:
        if self.rows_left_out:
            return f"{self.path}: {self.rows_left_out} rows not read ({self.reason}); left out"
        then = f"read {self.used} instead" if self.used else "left out"
        return f"{self.path}: unreadable ({self.reason}); {then}"


def valid_rows(rows: pd.DataFrame) -> tuple[pd.DataFrame, str | None]:
    """The rows that name ``REQUIRED`` identifiers and a known status; and why the others are not rows, or None."""
    missing = [c for c in REQUIRED if c not in rows.columns]
    if missing:
        return rows.iloc[0:0], f"no {', '.join(missing)} column: not a kvbench rows table"
    # A run's table holds a few rows: plain Python over its values beats pandas' per-call overhead (the report
    # reads hundreds of these).
    if all(isinstance(v, str) and v for c in REQUIRED for v in rows[c].tolist()) \
            and all(v in STATUSES for v in rows["status"].tolist()):
        return rows, None
    named = rows[list(REQUIRED)].notna().all(axis=1) & (rows[list(REQUIRED)].astype(str) != "").all(axis=1)
    known = rows["status"].isin(STATUSES)
    bad = rows[~(named & known)]
    if bad.empty:
        return rows, None
    unknown = sorted({str(s) for s in bad["status"] if s not in STATUSES and not pd.isna(s)})
    why = [f"status {', '.join(map(repr, unknown[:3]))} is not one of {', '.join(STATUSES)}"] if unknown else []
    if not named.all():
        why.append(f"empty {'/'.join(REQUIRED)}")
    return rows[named & known], "; ".join(why) or "not kvbench rows"


@dataclass
class Collection:
    rows: pd.DataFrame
    points: pd.DataFrame
    commands: list[RunCommand] = field(default_factory=list)
    run_dirs: list[str] = field(default_factory=list)
    rate_probes: pd.DataFrame = field(default_factory=pd.DataFrame)
    steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    problems: list[ReadProblem] = field(default_factory=list)
    incomplete: list[tuple[str, Path]] = field(default_factory=list)  # (label, folder): config.yaml or an empty rows table
    folders: dict[str, Path] = field(default_factory=dict)  # run_dir label -> the folder on disk (its tokens.jsonl)

    def warnings(self) -> list[str]:
        """One line per folder or file the report could not use in full."""
        return ([p.line() for p in self.problems]
                + [f"{path}: incomplete (a run folder without rows)" for _, path in self.incomplete])


def _visible(root: Path, d: Path) -> bool:
    return not any(part.startswith(".") for part in d.relative_to(root).parts)  # not .hydra/ and the like


def find_run_dirs(root: Path) -> list[Path]:
    """Folders holding rows.parquet or rows.csv, sorted (the all_runs tables are not run folders)."""
    found = {p.parent for pattern in ("rows.parquet", "rows.csv") for p in root.rglob(pattern)}
    return sorted(d for d in found if _visible(root, d))


def find_config_dirs(root: Path) -> list[Path]:
    """Folders a run started in: the harness writes config.yaml first and the rows last."""
    return sorted(p.parent for p in root.rglob("config.yaml") if _visible(root, p.parent))


def _reason(e: Exception, path: Path) -> str:
    """The error's first line, naming the file by its name only (REPORT.md must not hold this machine's paths)."""
    lines = str(e).replace(str(path), path.name).strip().splitlines()
    text = f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
    return text if len(text) <= 160 else text[:159] + "…"


def read_table(run_dir: Path, stem: str, problems: list[ReadProblem] | None = None,
               label: str | None = None) -> pd.DataFrame | None:
    """``<stem>.parquet``, else ``<stem>.csv``; None when neither exists or neither can be read.

    A file that exists but cannot be read is added to ``problems``; an empty CSV is a table
    without rows (a job killed before it wrote one), not a problem."""
    problems = [] if problems is None else problems
    label = label or run_dir.as_posix()
    pq, csv = run_dir / f"{stem}.parquet", run_dir / f"{stem}.csv"
    failed: list[ReadProblem] = []
    # Read as untrusted data (harness/untrusted.py): a regular file inside the run folder, within size limits.
    if pq.exists() or pq.is_symlink():
        try:
            return read_untrusted_table(pq, root=run_dir)
        except Exception as e:  # noqa: BLE001 - pyarrow's errors for a truncated or foreign file have no common base
            failed.append(ReadProblem(f"{label}/{pq.name}", pq, _reason(e, pq)))
    if csv.exists() or csv.is_symlink():
        try:
            df = read_untrusted_table(csv, root=run_dir)
        except pd.errors.EmptyDataError:
            df = pd.DataFrame()
        except (pd.errors.ParserError, UnicodeDecodeError, OSError, UntrustedError) as e:
            failed.append(ReadProblem(f"{label}/{csv.name}", csv, _reason(e, csv)))
            df = None
        if df is not None:
            for p in failed:
                p.used = csv.name
            problems += failed
            return df
    problems += failed
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
    return typed(df)  # counts as nullable integers, true/false as nullable booleans


def concat(frames: list[pd.DataFrame], first: list[str]) -> pd.DataFrame:
    """One frame with every column any frame has (``first`` leading); a value a frame lacks stays empty."""
    columns = list(first)
    for f in frames:
        columns += [c for c in f.columns if c not in columns]
    if not frames:
        return pd.DataFrame(columns=columns)
    # All-empty columns are given their type afterwards: concatenating them would be ambiguous.
    frames = [f.dropna(axis=1, how="all") for f in frames]
    # pandas aligns each frame's columns with all the others': hundreds of small frames of a few dozen column
    # sets (about one per sweep) join 2.7x faster set by set, each row numbered by its place, then put back
    # in that order.
    groups: dict[tuple, list[pd.DataFrame]] = {}
    start = 0
    for f in frames:
        groups.setdefault(tuple(f.columns), []).append(f.set_axis(range(start, start + len(f))))
        start += len(f)
    parts = [pd.concat(g, sort=False) if len(g) > 1 else g[0] for g in groups.values()]
    df = pd.concat(parts, sort=False).sort_index(kind="stable").reset_index(drop=True)
    return numeric(df.reindex(columns=columns))


def _load_yaml(path: Path):
    """A YAML file of a run folder as plain data (harness/untrusted.py: a regular file in its own folder, size
    and alias limits), or None without PyYAML (the GPU machine may lack it) or when it is not readable."""
    try:
        import yaml  # noqa: F401 - only to know that it is there
    except ImportError:
        return None
    try:
        return read_yaml(path, root=path.parent)
    except UntrustedError:
        return None


def _overrides(cfg, group: str) -> list[str]:
    try:
        items = cfg["hydra"]["overrides"][group] or []
    except (KeyError, TypeError):
        return []
    if not isinstance(items, list):
        return []
    return [str(i) for i in items if not str(i).startswith("hydra.mode=")]  # -m already says it


def _task_overrides(path: Path) -> list[str] | None:
    """``.hydra/overrides.yaml`` (``- key=value`` lines); read line by line when PyYAML is missing."""
    if not path.exists():
        return None
    items = _load_yaml(path)
    if items is None:
        try:
            text = read_text(path, YAML_LIMIT, root=path.parent)
        except UntrustedError:
            return None
        items = [ln[2:].strip() for ln in text.splitlines() if ln.startswith("- ")]
    return [str(i) for i in items] if isinstance(items, list) else None


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


@dataclass
class _RunTables:
    """One run folder as read from disk: its rows and, where it has rows, its side tables; and the problems
    each read met (kept apart: the rows' come before the folder's own rows problem, the side tables' after)."""
    label: str
    rows: pd.DataFrame | None
    problems: list[ReadProblem]
    tables: dict[str, pd.DataFrame | None]
    side_problems: list[ReadProblem]


def _read_run(root: Path, d: Path) -> _RunTables:
    label = _label(root, d)
    problems: list[ReadProblem] = []
    rows = read_table(d, "rows", problems, label)
    side_problems: list[ReadProblem] = []
    tables = {} if rows is None or rows.empty else {name: read_table(d, name, side_problems, label)
                                                    for name in SIDE_TABLES}
    return _RunTables(label, rows, problems, tables, side_problems)


def _read_all(root: Path, dirs: list[Path]) -> list[_RunTables]:
    """``_read_run`` of every folder, in order. pyarrow decodes a Parquet file outside the GIL, so two threads
    read the hundreds of small tables of a results folder about 1.3x faster than one."""
    workers = min(4, os.cpu_count() or 1, max(1, len(dirs)))
    if workers == 1:
        return [_read_run(root, d) for d in dirs]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda d: _read_run(root, d), dirs))


def collect(roots: list[Path], external: ExternalDefaults | None = None) -> Collection:
    """Every run folder's rows and side tables under ``roots``, and other systems' results (``external``: the
    device and batch of vLLM files that record neither)."""
    rows_frames, commands, labels = [], [], []
    side: dict[str, list[pd.DataFrame]] = {name: [] for name in SIDE_TABLES}
    problems: list[ReadProblem] = []
    incomplete: list[tuple[str, Path]] = []
    folders: dict[str, Path] = {}
    for root in roots:
        dirs = find_run_dirs(root)
        per_dir = {}
        for d, run in zip(dirs, _read_all(root, dirs)):
            label, rows = run.label, run.rows
            problems += run.problems
            if rows is None:  # listed among the problems
                continue
            if rows.empty:
                incomplete.append((label, d))
                continue
            read, (rows, why) = len(rows), valid_rows(rows)
            if why is not None:  # garbage appended, another schema, an unknown status: warned, not read
                problems.append(ReadProblem(f"{label}/rows", d / "rows", why, rows_left_out=read - len(rows)))
                if rows.empty:
                    continue
            # consolidated (Parquet gives one block per column, and one more would warn); the folder's
            # place is its run_dir, and the run_id each row recorded (the same, where it was written) goes.
            rows = rows.drop(columns="run_id", errors="ignore").copy()
            rows["run_dir"] = label
            folders[label] = d
            per_dir[d] = rows
            rows_frames.append(rows)
            labels.append(label)
            problems += run.side_problems
            for name, table in run.tables.items():
                if table is not None and not table.empty:
                    table = table.drop(columns="run_id", errors="ignore")
                    table["run_dir"] = label
                    side[name].append(table)
        seen = set(dirs)
        incomplete += [(_label(root, d), d) for d in find_config_dirs(root) if d not in seen]
        commands += _commands(root, list(per_dir), per_dir)
    for root in roots:  # other systems' benchmark JSON (external/<system>/*.json) as rows: harness/report/external.py
        frames, unread = read_external(root, lambda path, root=root: _label(root, path), external)
        rows_frames += frames
        problems += [ReadProblem(label, path, why) for label, path, why in unread]
    rows = concat(rows_frames, ["run_dir", *(c for c in COLUMNS if c != "run_id")])
    tables = {name: concat(frames, ["run_dir"]) for name, frames in side.items()}
    return Collection(rows, tables["points"], commands, labels, rate_probes=tables["rate_probes"],
                      steps=tables["steps"], problems=problems, incomplete=sorted(incomplete), folders=folders)
