"""The public validation set of the simulated clock: published real-GPU serving figures, one per row.

docs/validation/published_points.csv holds them; each row carries its source (URL, date, engine and version)
and the configuration that produced the figure (GPU and count, model, weight dtype, lengths, request rate,
number of requests, client concurrency), so that ``python -m harness.front.clock_check`` can price it by kvbench's
own command line. This module reads and checks the file; harness/front/clock_check_price.py prices a row.

The split: rows are numbered from 0 within their source (``source_url``) in file order; every third one
(number % 3 == 2) is ``holdout``, the rest ``fit``. A constant may be chosen on fit rows only, so the
holdout errors are on figures nothing was tuned to.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from kvbench.harness.errors import ConfigError

DEFAULT_SET = Path(__file__).resolve().parents[2] / "docs" / "validation" / "published_points.csv"

# Metric names follow vLLM's `vllm bench serve` summary: a latency's statistic, or a throughput.
METRICS = ("ttft_ms_mean", "ttft_ms_p50", "tpot_ms_mean", "tpot_ms_p50", "itl_ms_mean", "itl_ms_p50",
           "e2el_ms_mean", "e2el_ms_p50", "output_tok_s", "req_s")
WORKLOADS = ("fixed", "sharegpt")
SPLITS = ("fit", "holdout")
WEIGHT_DTYPES = ("", "float16", "bfloat16", "fp8")
KV_DTYPES = ("", "fp8_e4m3", "fp8_e5m2", "int8")
COLUMNS = ("id", "source_url", "source_date", "engine", "engine_version", "gpu", "gpu_count", "model",
           "published_model", "dtype", "weight_dtype", "kv_dtype", "workload", "prompt_len", "output_len", "output_len_mean",
           "request_rate",
           "num_requests", "max_concurrency", "metric", "value", "split", "note", "engine_overrides")
# The engine figures a row may set for its own run (``engine_overrides``): the kernels or host its source ran where
# they differ from the engine profile's defaults (e.g. an older release's kernel configs), each a plain number.
ENGINE_OVERRIDE_KEYS = ("step_overhead_us", "seq_overhead_us", "layer_overhead_us", "frontend_ms", "gemm_knee",
                        "moe_gemm_half_n")


@dataclass(frozen=True)
class Point:
    """One published figure and the configuration it was measured under."""

    id: str
    source_url: str
    source_date: str
    engine: str
    engine_version: str
    gpu: str  # a conf/gpu/ name
    gpu_count: int  # tensor parallel
    model: str  # a conf/model/ name (the published model's architecture)
    published_model: str
    dtype: str
    weight_dtype: str  # '' = the model's dtype
    kv_dtype: str  # '' = the model's dtype
    workload: str
    prompt_len: int
    output_len: int  # each request's max_tokens
    request_rate: float  # math.inf: every request at once (offline, or a closed loop at max_concurrency)
    num_requests: int
    max_concurrency: int | None  # the client's cap on requests in flight (vllm bench serve --max-concurrency)
    metric: str
    value: float
    split: str
    note: str
    # None: every output is output_len tokens (--ignore-eos). Else outputs stopped at EOS or output_len, this many
    # on average (the source's own output tok/s over its req/s): priced as lengths uniform up to output_len.
    output_len_mean: float | None = None
    # engine.KEY=VALUE overrides of the row's engine profile (ENGINE_OVERRIDE_KEYS), each with its reason in the note
    engine_overrides: tuple[str, ...] = ()


def split_for(position_in_source: int) -> str:
    """The stated rule: every third row of a source (0-based position % 3 == 2) is held out."""
    return "holdout" if position_in_source % 3 == 2 else "fit"


def _bad(row_id: str, key: str, value, allowed: str) -> ConfigError:
    return ConfigError(f"published point {row_id!r}: {key}={value!r}; allowed: {allowed}")


def _int(row: dict, key: str, low: int) -> int:
    try:
        v = int(row[key])
    except (TypeError, ValueError):
        raise _bad(row["id"], key, row[key], f"an integer >= {low}") from None
    if v < low:
        raise _bad(row["id"], key, row[key], f"an integer >= {low}")
    return v


def parse_engine_overrides(rid: str, text: str) -> tuple[str, ...]:
    """A row's ``engine_overrides``: space-separated ``engine.KEY=NUMBER``, KEY one of ENGINE_OVERRIDE_KEYS, each
    once. Only plain numbers: the set is data, and its values reach a command line."""
    allowed = f"space-separated engine.KEY=NUMBER, KEY one of {', '.join(ENGINE_OVERRIDE_KEYS)}"
    out, seen = [], set()
    for item in text.split():
        key, eq, value = item.partition("=")
        name = key.removeprefix("engine.")
        if not eq or not key.startswith("engine.") or name not in ENGINE_OVERRIDE_KEYS or name in seen:
            raise _bad(rid, "engine_overrides", text, allowed + " (each once)")
        try:
            number = float(value)
        except ValueError:
            raise _bad(rid, "engine_overrides", text, allowed) from None
        if not math.isfinite(number) or number < 0:
            raise _bad(rid, "engine_overrides", text, allowed + " (finite, >= 0)")
        seen.add(name)
        out.append(f"engine.{name}={number:g}")
    return tuple(out)


def parse_row(row: dict) -> Point:
    """One CSV row into a Point; a ConfigError names the row, the key, the value and what is allowed."""
    missing = [c for c in COLUMNS if c not in row]
    if missing:
        raise ConfigError(f"published point {row.get('id')!r}: missing columns {missing}; need {list(COLUMNS)}")
    rid = row["id"]
    for key in ("id", "source_url", "engine", "gpu", "model", "dtype"):
        if not row[key].strip():
            raise _bad(rid, key, row[key], "a non-empty value")
    if not row["source_url"].startswith("https://"):
        raise _bad(rid, "source_url", row["source_url"], "an https:// URL")
    for key, allowed in (("metric", METRICS), ("workload", WORKLOADS), ("split", SPLITS),
                         ("weight_dtype", WEIGHT_DTYPES), ("kv_dtype", KV_DTYPES)):
        if row[key] not in allowed:
            raise _bad(rid, key, row[key], ", ".join(a or "''" for a in allowed))
    try:
        rate = math.inf if row["request_rate"] == "inf" else float(row["request_rate"])
        value = float(row["value"])
    except ValueError as e:
        raise _bad(rid, "request_rate/value", (row["request_rate"], row["value"]), f"numbers ({e})") from None
    if not rate > 0:
        raise _bad(rid, "request_rate", row["request_rate"], "'inf' or a rate > 0")
    if not value > 0:
        raise _bad(rid, "value", row["value"], "a number > 0")
    conc = None if row["max_concurrency"] == "" else _int(row, "max_concurrency", 1)
    output_len = _int(row, "output_len", 1)
    mean = None
    if row["output_len_mean"] != "":
        try:
            mean = float(row["output_len_mean"])
        except ValueError:
            raise _bad(rid, "output_len_mean", row["output_len_mean"], "a number, or empty") from None
        if not (output_len + 1) / 2 <= mean <= output_len:  # uniform in [2*mean - output_len, output_len], from 1
            raise _bad(rid, "output_len_mean", row["output_len_mean"],
                       f"empty, or a mean in [(output_len + 1) / 2, output_len] = [{(output_len + 1) / 2:g}, {output_len}]")
    return Point(id=rid, source_url=row["source_url"], source_date=row["source_date"], engine=row["engine"],
                 engine_version=row["engine_version"], gpu=row["gpu"], gpu_count=_int(row, "gpu_count", 1),
                 model=row["model"], published_model=row["published_model"], dtype=row["dtype"],
                 weight_dtype=row["weight_dtype"], kv_dtype=row["kv_dtype"], workload=row["workload"],
                 prompt_len=_int(row, "prompt_len", 1), output_len=output_len, output_len_mean=mean,
                 request_rate=rate, num_requests=_int(row, "num_requests", 1), max_concurrency=conc,
                 metric=row["metric"], value=value, split=row["split"], note=row["note"],
                 engine_overrides=parse_engine_overrides(rid, row["engine_overrides"]))


def check_splits(points: list[Point]) -> None:
    """Every row's split is the stated rule's (harness/front/clock_check_points.py docstring)."""
    seen: dict[str, int] = {}
    for p in points:
        n = seen.get(p.source_url, 0)
        seen[p.source_url] = n + 1
        if p.split != split_for(n):
            raise _bad(p.id, "split", p.split, f"{split_for(n)} (row {n} of its source: every third is holdout)")


def load_points(path: Path = DEFAULT_SET) -> list[Point]:
    """Read and check the set: unique ids, every row parsed, the splits by the rule."""
    with open(path, newline="") as f:
        points = [parse_row(r) for r in csv.DictReader(f)]
    ids = [p.id for p in points]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ConfigError(f"{path}: id must be unique; repeated: {dup}")
    check_splits(points)
    return points
