"""The run folder as a guarded place: one writer at a time, one job per folder, no stale files.

``job.json`` names the job whose files the folder holds (harness/job/identity.py). A
run takes the folder's lock, then claims it: a folder that holds another job is
refused; one that holds this job is either resumed (its finished rows kept) or
cleared of the earlier attempt's files before anything is written.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pandas as pd
from filelock import FileLock, Timeout

from kvbench.harness.untrusted.git import committed_unchanged
from kvbench.harness.results import write_json, write_run, write_tokens
from kvbench.harness.untrusted import RECORD_LIMIT, TABLE_LIMIT, UntrustedError, bare_name, own_file, read_json, read_text
from kvbench.harness.untrusted import read_table as read_untrusted_table

JOB_FILE = "job.json"
LOCK_FILE = ".kvbench.lock"
ROWS, TOKENS = "rows", "tokens.jsonl"
# Side tables a folder written before job.json listed its tables may hold.
KNOWN_TABLES = ("points", "requests", "steps")
FINAL = ("ok", "oom", "skipped")  # statuses that resume keeps; error and interrupted re-run
# What a machine is, for resume: rows measured on another CPU or GPU model, core or GPU count, or
# torch are never kept as this machine's (a slug such as cpu-intel-xeon-2core still names many machines).
MACHINE = ("device", "cpu_name", "cpu_count", "gpu_name", "gpu_count", "torch_version")
KEPT = "_kept"  # marks the rows a resumed job returns unchanged (never written: they are already there)


class RunFolderError(Exception):
    """The folder cannot be written by this run; the message names it and says what to do."""


def read_table(path_stem: Path) -> pd.DataFrame | None:
    """``<stem>.parquet``, else ``<stem>.csv``; None when neither is there or readable. Read as untrusted
    data (harness/untrusted.py): a regular file inside the stem's folder, within the size limits."""
    for path in (path_stem.with_suffix(".parquet"), path_stem.with_suffix(".csv")):
        if path.exists():
            try:
                return read_untrusted_table(path, root=path_stem.parent)
            except Exception:  # noqa: BLE001 - a damaged or refused table: try its twin, else treat as absent
                continue
    return None


def table_names(job: dict | None) -> list[str]:
    """The side tables a job.json lists, those that are bare names only: a name is joined to the folder and
    its files deleted on a fresh start, so an absolute path or ``../victim`` is never one (and is ignored)."""
    names = (job or {}).get("tables") or []
    kept = []
    for name in names if isinstance(names, list) else []:
        try:
            kept.append(bare_name(name, "a table in job.json"))
        except UntrustedError:
            continue
    return kept


def _records(df: pd.DataFrame) -> list[dict]:
    """Rows as dicts with None (not NaN) where a value is missing, as the scenarios write them."""
    return df.astype(object).where(df.notna(), None).to_dict("records")


@dataclass
class Previous:
    """What an earlier attempt of the same job left: its rows, tokens and side tables."""

    rows: list[dict] = field(default_factory=list)
    tokens: list[dict] = field(default_factory=list)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)

    def rows_of(self, impl: str) -> list[dict]:
        return [r for r in self.rows if r.get("impl") == impl]

    def done(self, impl: str) -> bool:
        """The impl has rows and every one has a final status."""
        rows = self.rows_of(impl)
        return bool(rows) and all(r.get("status") in FINAL for r in rows)

    def without(self, impls: set[str]) -> Previous:
        """Drop what the given impls left (they run again and write it anew)."""
        tables = {name: (t[~t["impl"].isin(impls)] if "impl" in t.columns else t) for name, t in self.tables.items()}
        return Previous([r for r in self.rows if r.get("impl") not in impls],
                        [t for t in self.tokens if t.get("impl") not in impls], tables)


def sweep_home(sweep_dir: Path, numbered: Path, job_id: str) -> Path:
    """The folder of the sweep's job ``job_id``: found by identity, never by number.

    The folder (whatever its number) whose job.json holds ``job_id``; else the job's numbered
    folder when that holds no other job; else a folder named by the identity, so a sweep whose
    values were reordered or extended never writes over another job's results. One identity,
    one folder.
    """
    for job_file in sorted(sweep_dir.glob(f"*/{JOB_FILE}")):
        held = RunFolder(job_file.parent).job()
        if held and held["job_id"] == job_id:
            return job_file.parent
    held = RunFolder(numbered).job()
    return numbered if held is None or held["job_id"] == job_id else sweep_dir / f"job-{job_id}"


class RunFolder:
    def __init__(self, path: Path):
        self.path = path
        self._tables: list[str] = []

    @contextmanager
    def locked(self) -> Iterator[RunFolder]:
        """Hold the folder's lock; a second writer fails at once instead of interleaving files.

        The OS releases the lock when its holder dies (even by kill -9), so no stale lock
        survives a crash.
        """
        self.path.mkdir(parents=True, exist_ok=True)
        # filelock opens the file to truncate it: a planted link there would truncate what it points to
        lock = FileLock(own_file(self.path / LOCK_FILE), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            raise RunFolderError(f"another kvbench run is writing to {self.path}; wait for it to finish "
                                 "or choose another folder (hydra.run.dir=... or hydra.sweep.dir=...)") from None
        try:
            yield self
        finally:
            lock.release()

    def job(self) -> dict | None:
        """The folder's job.json, or None (a new folder, or one written before job.json existed)."""
        if not (self.path / JOB_FILE).exists():
            return None
        try:
            job = read_json(self.path / JOB_FILE, RECORD_LIMIT, root=self.path)
        except UntrustedError:
            return None
        return job if isinstance(job, dict) and isinstance(job.get("job_id"), str) and job["job_id"] else None

    def measured_elsewhere(self, machine: dict) -> str | None:
        """How the machine that wrote the folder's env.json differs from ``machine`` (``key: then -> now``),
        or None when it is the same; an unreadable or absent env.json counts as another machine."""
        try:
            then = read_json(self.path / "env.json", RECORD_LIMIT, root=self.path)
        except UntrustedError:
            return "no readable env.json"
        if not isinstance(then, dict):
            return "no readable env.json"
        diffs = [f"{k}: {then.get(k)} -> {machine.get(k)}" for k in MACHINE if str(then.get(k)) != str(machine.get(k))]
        return "; ".join(diffs) or None

    def shipped(self) -> bool:
        """Whether the folder's rows came with the checkout: committed to git and unchanged since.

        Such rows are the project's published figures, measured on the machine that published
        them. A fresh clone on a machine of the same model would otherwise resume them all and
        measure nothing. Rows this machine wrote (an interrupted sweep's) are new or modified
        files, and resume keeps them. Outside kvbench's own checkout nothing counts as shipped: git is
        asked about this checkout from its root (harness/untrusted/git.py), never from the folder, which may hold
        a repository of its own.
        """
        rows = next((p for p in (self.path / f"{ROWS}.csv", self.path / f"{ROWS}.parquet") if p.exists()), None)
        return rows is not None and committed_unchanged(rows)

    def refuse_other(self, job_id: str | None) -> None:
        """Raise unless the folder is new, of unknown job, or holds ``job_id``'s files."""
        held = self.job()
        if held and held["job_id"] != job_id:
            raise RunFolderError(
                f"{self.path} holds another job's results (job_id {held['job_id']}, see its config.yaml); "
                "choose another folder (hydra.run.dir=... or hydra.sweep.dir=...) or delete it "
                "(`make sweep FRESH=1` starts the default sweep afresh)")

    def claim(self, job_id: str, device_slug: str, resume: bool) -> Previous:
        """Make the folder this job's; with ``resume``, return what an earlier attempt of it left.

        Without resume (or when the folder's job is unknown), the earlier attempt's rows,
        tokens and side tables are removed first, so none can be mistaken for this run's.
        """
        self.refuse_other(job_id)
        held = self.job()
        previous = self.read() if resume and held else Previous()
        if not previous.rows:
            self.clear(held)
            previous = Previous()
        self._tables = list(previous.tables)
        self._write_job(job_id, device_slug)
        return previous

    def read(self) -> Previous:
        rows = read_table(self.path / ROWS)
        try:
            lines = read_text(self.path / TOKENS, TABLE_LIMIT, root=self.path).splitlines()
            tokens = [rec for line in lines if line.strip() and isinstance(rec := json.loads(line), dict)]
        except (UntrustedError, ValueError):
            tokens = []  # none written yet, or damaged: the impls that need them run again
        tables = {n: t for n in table_names(self.job()) if (t := read_table(self.path / n)) is not None}
        if rows is None:  # no rows: nothing finished, nothing to keep
            return Previous()
        return Previous(_records(rows), tokens, tables)

    def clear(self, held: dict | None) -> None:
        names = {ROWS, *KNOWN_TABLES, *table_names(held)}
        for name in names:
            for suffix in (".csv", ".parquet"):
                (self.path / f"{name}{suffix}").unlink(missing_ok=True)
        (self.path / TOKENS).unlink(missing_ok=True)
        for result in self.path.glob("vllm-*.json"):  # harness/results/vllm_json.py: one per impl row
            result.unlink(missing_ok=True)

    def _write_job(self, job_id: str, device_slug: str) -> None:
        self._job = {"job_id": job_id, "device_slug": device_slug}
        write_json(self.path / JOB_FILE, {**self._job, "tables": self._tables})

    def write(self, rows: list[dict], tokens: list[dict], tables: dict[str, pd.DataFrame]) -> None:
        """Everything the job has so far. Rows go last: an impl counts as finished only once
        its row is in, so a kill between the files leaves it to re-run."""
        if set(tables) - set(self._tables):  # job.json lists a table before it exists, for clear()
            self._tables += [n for n in tables if n not in self._tables]
            write_json(self.path / JOB_FILE, {**self._job, "tables": self._tables})
        if tokens:
            write_tokens(self.path / TOKENS, tokens)
        write_run(self.path, rows, tables)
