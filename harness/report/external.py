"""Other systems' benchmark JSON as report rows: every ``external/<system>/*.json`` under a report folder.

``results/external/vllm/run1.json`` is a row of impl ``vllm`` (the folder's name: the system that
ran), ``scenario=decode`` and ``source=external``, beside kvbench's own decode and service rows.
A file is one of:

- vLLM's ``vllm bench serve --save-result`` JSON (one object; or one per line, as ``--append-result``
  writes them): mapped by harness/results/vllm_json.py, the one home of that mapping;
- AIPerf's ``profile_export_aiperf.json``: the few metrics whose definitions are kvbench's
  (``AIPERF`` below, units read from each metric's own ``unit``).

A file is data: it is parsed as JSON and nothing in it runs, every value is checked as it is read,
and a file that is none of these, or holds a value of the wrong kind, is one problem line naming
the file and the key; the report goes on without it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import pandas as pd

from kvbench.harness.results import tidy
from kvbench.harness.results.consistency import check_consistency, judged
from kvbench.harness.untrusted import JSON_LIMIT, UntrustedError, read_text
from kvbench.harness.results.vllm_json import VllmJsonError, from_vllm, looks_like_vllm

EXTERNAL = "external"  # <report folder>/external/<system>/*.json
SOURCE = "external"  # the rows' ``source`` column (kvbench's own rows leave it empty)

# AIPerf metric tag -> kvbench column stem. AIPerf's inter_token_latency is (request latency - TTFT) /
# (output tokens - 1) per request: vLLM's and kvbench's TPOT (its inter_chunk_latency counts SSE
# chunks, not tokens, so it is not kvbench's ITL and is left out). request_latency is E2EL.
AIPERF_LATENCIES = {"time_to_first_token": "ttft", "inter_token_latency": "tpot", "request_latency": "e2el"}
AIPERF_STATS = {"avg": "mean", "p50": "p50", "p90": "p90", "p99": "p99"}
# AIPerf metric tag -> (kvbench column, the units it may come in, each with its factor to kvbench's unit).
_TO_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3, "sec": 1e3}
AIPERF_SCALARS: dict[str, tuple[str, dict[str, float]]] = {
    "benchmark_duration": ("duration_s", {u: f / 1e3 for u, f in _TO_MS.items()}),
    "request_throughput": ("achieved_rps", {"requests/sec": 1.0}),
    "output_token_throughput": ("output_tokens_per_s", {"tokens/sec": 1.0}),
    "total_token_throughput": ("tokens_per_s", {"tokens/sec": 1.0}),
    "total_isl": ("prompt_tokens", {"tokens": 1.0}),
    "total_osl": ("output_tokens", {"tokens": 1.0}),
    "error_request_count": ("rejected", {"requests": 1.0}),
}


COUNTED = ("tokens", "requests")  # the units of counts


@dataclass(frozen=True)
class ExternalDefaults:
    """The device and batch of imported vLLM results that do not record them (``python -m harness.report
    --external-device SLUG --external-batch N``): without both, such a file cannot be drawn beside kvbench's
    rows of the same machine and batch, so it is not read, and its problem line says how to give them."""
    device: str | None = None
    batch: int | None = None

    def __post_init__(self):
        if self.batch is not None and (isinstance(self.batch, bool) or not isinstance(self.batch, int)
                                       or self.batch < 1):
            raise ValueError(f"external batch must be a whole number of requests >= 1, got {self.batch!r}")
        if self.device is not None and not self.device.strip():
            raise ValueError("external device must name a machine (a device slug such as nvidia-h100), got ''")


RUN_FIELDS = {"device_slug": ("device", "--external-device SLUG"), "batch": ("batch", "--external-batch N")}


def with_run(row: dict, defaults: ExternalDefaults) -> dict:
    """A vLLM row with its device and batch: the file's, else ``defaults``'; ``ExternalFileError`` names
    what is missing and the two ways to give it."""
    given = {"device_slug": defaults.device, "batch": defaults.batch}
    row = {**{k: v for k, v in given.items() if v is not None}, **row}
    missing = [name for name in RUN_FIELDS if row.get(name) is None]
    if missing:
        keys = " and ".join(RUN_FIELDS[m][0] for m in missing)
        meta = " ".join(f"{RUN_FIELDS[m][0]}=<{'slug' if m == 'device_slug' else 'n'}>" for m in missing)
        flags = " ".join(RUN_FIELDS[m][1] for m in missing)
        raise ExternalFileError(f"records no {keys}, so it cannot be drawn beside kvbench's rows: run vllm bench "
                                f"serve with --metadata {meta}, add them to the file, or give them to the report "
                                f"with {flags}")
    return row


class ExternalFileError(ValueError):
    """The file is not one kvbench reads; the message says why, in one line."""


def _metric(tag: str, value) -> Mapping | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or not isinstance(value.get("unit"), str):
        raise ExternalFileError(f"{tag}: expected an object with a unit")
    return value


def _stat(where: str, v) -> float:
    """``v`` if it is a number; its range is the row's checks' (harness/results/consistency.py)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ExternalFileError(f"{where}: expected a number, got {str(v)[:40]!r}")
    if isinstance(v, int) and not -2**1023 < v < 2**1023:  # JSON's integers have no bound; float math overflows
        raise ExternalFileError(f"{where}: expected a number a float holds, got one of {len(str(abs(v)))} digits")
    return v


def looks_like_aiperf(obj) -> bool:
    """AIPerf gives each metric as an object with its ``unit``."""
    return isinstance(obj, Mapping) and any(isinstance(obj.get(t), Mapping) and "unit" in obj[t]
                                            for t in (*AIPERF_LATENCIES, *AIPERF_SCALARS))


def from_aiperf(result: Mapping) -> dict:
    """The row columns an AIPerf profile export gives, in kvbench's units; a figure out of its range or
    against another (harness/results/consistency.py) makes the row ``status=error``, naming the file's key."""
    row: dict = {"clock": "wall", "status": "ok"}
    names: dict[str, str] = {}  # row column -> the file's <tag>.<stat>, for the checks' clauses
    for tag, stem in AIPERF_LATENCIES.items():
        if (m := _metric(tag, result.get(tag))) is None:
            continue
        if m["unit"] not in _TO_MS:
            raise ExternalFileError(f"{tag}: unit {m['unit']!r} is not a time unit kvbench converts")
        for stat, col in AIPERF_STATS.items():
            if m.get(stat) is not None:
                row[f"{stem}_ms_{col}"] = _stat(f"{tag}.{stat}", m[stat]) * _TO_MS[m["unit"]]
                # a clause shows the row's value: its unit is said where the file's differs (a TTFT in s)
                names[f"{stem}_ms_{col}"] = f"{tag}.{stat}" + (" in ms" if _TO_MS[m["unit"]] != 1.0 else "")
    for tag, (col, units) in AIPERF_SCALARS.items():
        if (m := _metric(tag, result.get(tag))) is None or m.get("avg") is None:
            continue
        if m["unit"] not in units:
            raise ExternalFileError(f"{tag}: unit {m['unit']!r} is not one of {', '.join(units)}")
        value = _stat(f"{tag}.avg", m["avg"]) * units[m["unit"]]
        if m["unit"] in COUNTED and math.isfinite(value):  # a count is a whole number, read as it is (never rounded)
            if not float(value).is_integer() or not -2**63 <= value < 2**63:
                raise ExternalFileError(f"{tag}.avg: expected a whole number, got {value}")
            value = int(value)
        row[col], names[col] = value, f"{tag}.avg" + (" in s" if units[m["unit"]] != 1.0 else "")  # s, from a file in ms
    row["wall_s"] = row.get("duration_s")
    names["wall_s"] = names.get("duration_s", "benchmark_duration.avg")
    models = _at(result, "input_config", "endpoint", "model_names")  # AIPerf calls this section unstable: read if there
    if isinstance(models, list) and models and isinstance(models[0], str):
        row["model"] = models[0]
    # No throughput against its counts here: check_rates says why AIPerf's definitions do not allow it.
    return judged(row, check_consistency(row, names))


def _at(obj, *keys):
    """``obj[k1][k2]...``, or None where a level is missing or not an object."""
    for k in keys:
        obj = obj.get(k) if isinstance(obj, Mapping) else None
    return obj


def _objects(text: str) -> list:
    """The file's JSON values: one, or one per line (vLLM's ``--append-result``)."""
    try:
        return [json.loads(text)]
    except json.JSONDecodeError as e:
        if not e.msg.startswith("Extra data"):
            raise ExternalFileError(f"not JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ExternalFileError(f"line {n} is not JSON: {e.msg}") from None
    return out


def read_file(path: Path, system: str, label: str, root: Path | None = None,
              defaults: ExternalDefaults = ExternalDefaults()) -> list[dict]:
    """One row per result in the file at ``path``; ``ExternalFileError`` says, in one line, why it is not read.
    A vLLM result needs its device and batch, from the file or ``defaults`` (``with_run``).

    Read as untrusted data (harness/untrusted): a regular file (never a FIFO or a device) inside ``root`` (the
    report folder, when given: a link that leads out of it is not followed), at most ``JSON_LIMIT`` bytes."""
    try:
        objects = _objects(read_text(path, JSON_LIMIT, root=root))
    except ExternalFileError:
        raise
    except UntrustedError as e:
        raise ExternalFileError(str(e)) from None
    except RecursionError:  # nested deeper than the parser goes
        raise ExternalFileError("nested too deeply to be a result file") from None
    except ValueError as e:  # not JSONDecodeError: e.g. an integer of more digits than Python converts
        raise ExternalFileError(f"not readable JSON: {str(e).splitlines()[0].split(';')[0][:120]}") from None
    rows = []
    for i, obj in enumerate(objects, 1):
        where = f"result {i}: " if len(objects) > 1 else ""
        try:
            if looks_like_vllm(obj):
                row = with_run(from_vllm(obj), defaults)
                backend = obj.get("backend")
                what = "vllm bench serve result" + (f" (backend {backend})" if isinstance(backend, str) else "")
            elif looks_like_aiperf(obj):
                row, what = from_aiperf(obj), "AIPerf profile export"
            else:
                raise ExternalFileError("neither a vllm bench serve --save-result file nor an AIPerf "
                                        "profile_export_aiperf.json")
        except (VllmJsonError, ExternalFileError) as e:
            raise ExternalFileError(f"{where}{e}") from None
        run_dir = f"{label}#{i}" if len(objects) > 1 else label  # where the row came from, as for a run folder
        rows.append({**row, "run_dir": run_dir, "scenario": "decode", "impl": system, "source": SOURCE,
                     "notes": what})
    return rows


def find_external_files(root: Path) -> list[Path]:
    """``external/<system>/*.json`` at any depth under ``root``, hidden folders aside."""
    return sorted(p for p in root.rglob(f"{EXTERNAL}/*/*.json")
                  if not any(part.startswith(".") for part in p.relative_to(root).parts))


def read_external(root: Path, label: Callable[[Path], str], defaults: ExternalDefaults | None = None
                  ) -> tuple[list[pd.DataFrame], list[tuple[str, Path, str]]]:
    """The rows of every external file under ``root`` (one frame per file, in the row schema; ``run_dir``
    the file's label, as a run folder's rows have theirs instead of a ``run_id``), and for each file
    not read its (label, path, reason)."""
    frames, problems = [], []
    for path in find_external_files(root):
        name = label(path)
        try:
            rows = read_file(path, path.parent.name, name, root=root, defaults=defaults or ExternalDefaults())
        except ExternalFileError as e:
            problems.append((name, path, str(e)))
            continue
        if rows:
            frames.append(tidy(rows).drop(columns="run_id"))
    return frames, problems
