"""vLLM's benchmark result JSON (``vllm bench serve --save-result``), both ways: a kvbench row to it, it to a row.

The keys, their order and their units are vLLM's own (vllm-project/vllm, vllm/benchmarks/serve.py:
``main_async`` builds ``result_json`` and ``benchmark`` its ``result``), so scripts and dashboards
written for vLLM's files read kvbench runs, and the report reads vLLM's files as rows:

- summary latencies in milliseconds (``mean_ttft_ms``, ``median_tpot_ms``, ``p99_itl_ms`` ...),
  as kvbench's ``*_ms_*`` columns are; vLLM's ``median`` is the 50th percentile, ``std`` the
  population standard deviation (``np.std``), percentiles linear (``np.percentile``, as kvbench's);
- per-request lists (``ttfts``, ``latencies``, ``start_times``) in seconds, as kvbench's
  ``requests`` table is;
- ``duration`` in seconds, throughputs per second.

kvbench fills only what it measured; a key vLLM has and kvbench has no figure for is null.
The figures are those of the run whose latencies the row reports (with ``repeat`` > 1, the
representative repeat), so ``output_throughput`` is that run's output tokens / ``duration``,
as vLLM defines it.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from datetime import datetime, timezone
from numbers import Integral, Real
from pathlib import Path
from typing import Iterable, Mapping

import pandas as pd

from kvbench.harness.results import TableWriteError, atomic_write
from kvbench.harness.results.consistency import check_consistency, check_each, check_rates, judged

FILE_PREFIX = "vllm-"  # vllm-<impl>.json in the run folder, one per decode row
LATENCIES = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = (50, 90, 99)  # the row's percentiles: vLLM's keys for --metric-percentiles 50,90,99
DATE_FORMAT = "%Y%m%d-%H%M%S"  # vLLM's ``date``

# The keys that are one kvbench column each, the same figure in the same unit: vLLM key -> row column.
SAME_FIGURE: dict[str, str] = {
    "model_id": "model",
    "num_prompts": "num_requests",  # requests offered
    "duration": "duration_s",  # s: first arrival to last token
    "failed": "rejected",  # requests that never finished
    "total_input_tokens": "prompt_tokens",  # vLLM's: the completed requests' (the row's: every one offered)
    "total_output_tokens": "output_tokens",
    "request_throughput": "achieved_rps",  # completed requests / duration
    "request_goodput": "goodput_rps",  # requests meeting every SLO / duration (null without an SLO)
    "output_throughput": "output_tokens_per_s",  # output tokens / duration
    "total_token_throughput": "tokens_per_s",  # (input + output tokens) / duration
    **{f"{stat}_{m}_ms": f"{m}_ms_{col}" for m in LATENCIES
       for stat, col in (("mean", "mean"), ("median", "p50"), *((f"p{q}", f"p{q}") for q in PERCENTILES))},
}
TEXT = ("model_id",)
COUNTS = ("num_prompts", "failed", "total_input_tokens", "total_output_tokens", "completed")
# What a round trip needs and vLLM has no key for, written as vLLM's ``--metadata KEY=VALUE`` writes
# its own keys (top-level strings): the arrival process by kvbench's name, and the SLO held to.
METADATA = {"kvbench_arrival": "arrival", "kvbench_slo": "slo"}
# Where the run happened, how many requests it ran at once and on which workload, which vLLM's file does not
# record of itself: ``--metadata device=<slug> batch=<n> workload=<name>`` writes them as top-level strings
# (vLLM's ``max_concurrency``, the client's limit on requests in flight, is the batch where no ``batch`` was
# given). A kvbench file has them. The report draws a row beside kvbench's of the same device, model, workload.
RUN_KEYS = {"device": "device_slug", "batch": "batch", "workload": "workload"}
# vLLM's keys, in the order its result file has them (per-request lists and ``std_*`` included).
KEYS = (
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts", *METADATA, *RUN_KEYS,
    "request_rate", "burstiness", "max_concurrency",
    "duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
    "request_goodput", "output_throughput", "total_token_throughput",
    "input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "queue_times", "generated_texts",
    "errors", "max_output_tokens_per_s", "max_concurrent_requests", "rtfx",
    *[f"{stat}_{m}_ms" for m in LATENCIES for stat in ("mean", "median", "std", *(f"p{q}" for q in PERCENTILES))],
)


class VllmJsonError(ValueError):
    """A value in a vLLM result file is not what its key holds; the message names the key (one line)."""


def result_name(impl: str) -> str:
    """The file of ``impl``'s result: its name kept to characters safe in any file system."""
    return f"{FILE_PREFIX}{re.sub(r'[^A-Za-z0-9._-]', '_', impl)}.json"


def _plain(v):
    """A JSON-safe value: Python numbers (numpy's too); None for NaN, infinity and pandas' NA (strict JSON has none)."""
    if v is pd.NA:
        return None
    if v is None or isinstance(v, (bool, str, list)):
        return v
    if isinstance(v, Integral):
        return int(v)
    if isinstance(v, Real):
        return float(v) if math.isfinite(float(v)) else None
    return v


def _per_request(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per request, its samples together as kvbench's service metrics count a request
    (harness/serving/service_metrics.py): first token the earliest, finish the latest."""
    g = requests.sort_values(["request_id", "sample"]).groupby("request_id", sort=True)
    arrival = g["arrival_s"].min()
    out = pd.DataFrame({
        "input_len": g["prompt_len"].first(),
        "output_len": g["output_len"].sum(),
        "sample_len": g["output_len"].first(),  # tokens per sample: TPOT's denominator
        "samples": g.size(),
        "arrival_s": arrival,
        "ttft_s": g["first_token_s"].min() - arrival,
        "e2el_s": g["finish_s"].max() - arrival,
    })
    out["tpot_s"] = (out["e2el_s"] - out["ttft_s"]) / (out["sample_len"] - 1).where(out["sample_len"] > 1)
    return out


def _std_ms(seconds: pd.Series) -> float | None:
    vals = [v * 1e3 for v in seconds.dropna().tolist()]
    return statistics.pstdev(vals) if vals else None


def _date(measured_at) -> str:
    """vLLM's ``date`` (``%Y%m%d-%H%M%S``, here in UTC): when the row was measured (its ``measured_at``), else now."""
    try:
        return datetime.fromisoformat(str(measured_at)).strftime(DATE_FORMAT)
    except ValueError:
        return datetime.now(timezone.utc).strftime(DATE_FORMAT)


def _burstiness(arrival: str | None, burstiness: float | None) -> float | None:
    """vLLM's burstiness (the gamma shape of its gaps) where kvbench's arrivals have one: Poisson is 1."""
    return {"poisson": 1.0, "gamma": burstiness}.get(arrival or "")


def to_vllm(row: Mapping, requests: pd.DataFrame | None = None, burstiness: float | None = None,
            date: str | None = None) -> dict:
    """One decode row (and its impl's rows of the run's ``requests`` table, if kept) as vLLM's result dict.

    ``burstiness``: the run's ``arrival.burstiness`` (read for ``arrival=gamma`` only). The per-request
    lists are written when every request has one sample (vLLM has one output per prompt); ITLs per
    request, texts and client-side queue times are not in kvbench's tables and stay null.
    """
    out: dict = dict.fromkeys(KEYS)
    backend = f"kvbench-{row.get('impl')}"
    out.update(date=date or _date(row.get("measured_at")), endpoint_type=backend, backend=backend)
    for key, col in SAME_FIGURE.items():
        out[key] = _plain(row.get(col))
    for key, col in (*METADATA.items(), *RUN_KEYS.items()):
        out[key] = row.get(col)
    arrival = row.get("arrival")
    rate = _plain(row.get("request_rate"))
    out["request_rate"] = "inf" if arrival == "burst" else rate  # vLLM's word for every request at t=0
    out["burstiness"] = _burstiness(arrival, burstiness)
    duration, rejected = out["duration"], out["failed"]
    # The row keeps no count of completed requests; achieved_rps is that count / duration.
    completed = round(out["request_throughput"] * duration) if out["request_throughput"] and duration else None
    if rejected:  # the row's prompt tokens count every request offered; vLLM's, the completed ones
        out["total_input_tokens"] = None
    per = _per_request(requests) if requests is not None and not requests.empty else None
    if per is not None:
        completed = len(per)
        out["total_input_tokens"] = int(per["input_len"].sum())
        for m in ("ttft", "tpot", "e2el"):  # the row has no spread; the table gives it (ITL's gaps are not kept)
            out[f"std_{m}_ms"] = _std_ms(per[f"{m}_s"])
        if (per["samples"] == 1).all():
            out.update(input_lens=per["input_len"].astype(int).tolist(),
                       output_lens=per["output_len"].astype(int).tolist(),
                       ttfts=per["ttft_s"].astype(float).tolist(), latencies=per["e2el_s"].astype(float).tolist(),
                       start_times=per["arrival_s"].astype(float).tolist())  # s from the run's start
    out["completed"] = completed
    # vLLM's throughputs are over ``duration`` (the row's own are over the median wall time of its repeats).
    tokens_in, tokens_out = out["total_input_tokens"], out["total_output_tokens"]
    out["output_throughput"] = tokens_out / duration if duration and tokens_out is not None else None
    both = duration and tokens_in is not None and tokens_out is not None
    out["total_token_throughput"] = (tokens_in + tokens_out) / duration if both else None
    return {k: _plain(v) for k, v in out.items()}


def write_vllm_results(run_dir: Path, rows: Iterable[Mapping], requests: pd.DataFrame | None,
                       burstiness: float | None) -> list[Path]:
    """``vllm-<impl>.json`` for every decode row that measured (``status=ok``), written atomically;
    any other ``vllm-*.json`` in the folder (an earlier attempt's, an impl that failed) is removed,
    so a file there is always of a row there."""
    written: list[Path] = []
    for row in rows:
        if row.get("scenario") != "decode" or row.get("status") != "ok" or not row.get("impl"):
            continue
        impl = str(row["impl"])
        mine = requests[requests["impl"] == impl] if requests is not None and "impl" in requests else None
        text = json.dumps(to_vllm(row, mine, burstiness), allow_nan=False) + "\n"
        path = run_dir / result_name(impl)
        try:
            atomic_write(path, lambda tmp: tmp.write_text(text))
        except OSError as e:  # a full disk, a read-only folder: one line, as for the run's tables
            raise TableWriteError(f"{path} could not be written: {type(e).__name__}: {e.strerror or e}") from e
        written.append(path)
    for stale in run_dir.glob(f"{FILE_PREFIX}*.json"):
        if stale not in written:
            stale.unlink(missing_ok=True)
    return written


# --- reading ---------------------------------------------------------------------------------------------


def _number(key: str, v, whole: bool = False) -> float | int | None:
    """``v`` as the number ``key`` holds, checked for its kind as it is (no cast): a number, and a whole one
    for a count. Its range (finite, not negative) and its agreement with the file's other figures are
    checked on the row (harness/results/consistency.py), which then says so as an error row."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise VllmJsonError(f"{key}: expected a number, got {type(v).__name__} {str(v)[:40]!r}")
    if isinstance(v, int) and not -2**1023 < v < 2**1023:  # JSON's integers have no bound; float math overflows
        raise VllmJsonError(f"{key}: expected a number a float holds, got one of {len(str(abs(v)))} digits")
    if whole and math.isfinite(v):
        if not float(v).is_integer() or not -2**63 <= v < 2**63:
            raise VllmJsonError(f"{key}: expected a whole number, got {v}")
        return int(v)
    return v


def _text(key: str, v) -> str | None:
    if v is None or isinstance(v, str):
        return v
    raise VllmJsonError(f"{key}: expected text, got {type(v).__name__}")


def _numbers(key: str, v) -> list | None:
    if v is None:
        return None
    if not isinstance(v, list):
        raise VllmJsonError(f"{key}: expected a list, got {type(v).__name__}")
    return [_number(f"{key}[{i}]", x) for i, x in enumerate(v)]


def _arrival(result: Mapping) -> tuple[str | None, float | None]:
    """(arrival, offered rate) in kvbench's terms from vLLM's traffic keys."""
    strategy = _text("ramp_up_strategy", result.get("ramp_up_strategy"))
    if strategy is not None:  # the rate changes over the run: no one offered rate
        return f"ramp-up-{strategy}", None
    rate, shape = result.get("request_rate"), result.get("burstiness")
    if rate == "inf" or (isinstance(rate, float) and math.isinf(rate) and rate > 0):
        return "burst", None
    rate = _number("request_rate", rate)
    if isinstance(shape, float) and math.isinf(shape) and shape > 0:
        return "constant", rate  # vLLM: infinite burstiness is a constant gap
    shape = _number("burstiness", shape)
    if shape is not None and not (math.isfinite(shape) and shape > 0):  # a setting, not a figure: no row holds it
        raise VllmJsonError(f"burstiness: expected a gamma shape above 0 (or inf), got {shape}")
    if rate is None or shape is None:
        return None, rate
    return ("poisson" if shape == 1 else "gamma"), rate


def _run(result: Mapping) -> dict:
    """The row's ``device_slug``, ``workload`` and ``batch`` from the file's ``device``, ``workload`` and ``batch``
    (``--metadata`` writes text: a batch of ``"64"`` is read as 64), else ``max_concurrency`` for the batch;
    absent ones are left out."""
    out: dict = {}
    for key in ("device", "workload"):
        if (v := _text(key, result.get(key))) is not None and v.strip():
            out[RUN_KEYS[key]] = v.strip()
    key, batch = ("batch", result.get("batch")) if result.get("batch") is not None else \
        ("max_concurrency", result.get("max_concurrency"))
    if isinstance(batch, str):
        if not batch.strip().isdigit():
            raise VllmJsonError(f"{key}: expected a whole number of requests, got {batch[:40]!r}")
        batch = int(batch)
    batch = _number(key, batch, whole=True)
    if batch is not None:
        if batch < 1:
            raise VllmJsonError(f"{key}: expected a whole number of requests >= 1, got {batch}")
        out["batch"] = batch
    return out


def looks_like_vllm(obj) -> bool:
    """vLLM writes ``duration`` and ``completed`` in every result file."""
    return isinstance(obj, Mapping) and "duration" in obj and "completed" in obj


def from_vllm(result: Mapping) -> dict:
    """The row columns a vLLM result dict gives (kvbench's names and units); ``VllmJsonError`` names a bad key.

    ``normalized_latency_s`` (the mean of latency / output tokens) comes from the per-request lists,
    when the file has them (``--save-detailed``); requests that failed (0 output tokens) are left out.
    A figure out of its range or against another (harness/results/consistency.py) makes the row
    ``status=error``, naming the file's keys.
    """
    row: dict = {"clock": "wall"}  # vLLM times requests on the client's wall clock
    names: dict[str, str] = {}  # row column -> the file's key it holds, for the checks' clauses
    for key, col in SAME_FIGURE.items():
        v = result.get(key)
        v = _text(key, v) if key in TEXT else _number(key, v, whole=key in COUNTS)
        if v is not None or col not in row:  # median_*_ms and p50_*_ms are one column: either fills it
            row[col], names[col] = v, key
    for key, col in METADATA.items():
        if (v := _text(key, result.get(key))) is not None:
            row[col] = v
    row.update(_run(result))
    arrival, row["request_rate"] = _arrival(result)
    row.setdefault("arrival", arrival)
    row["wall_s"] = row["duration_s"]  # one run: its wall time is its duration
    names.update(request_rate="request_rate", wall_s="duration", normalized_latency_s="mean of latencies / output_lens")
    completed = _number("completed", result.get("completed"), whole=True)
    lat, out = _numbers("latencies", result.get("latencies")), _numbers("output_lens", result.get("output_lens"))
    if lat is not None and out is not None:
        if len(lat) != len(out):
            raise VllmJsonError(f"latencies ({len(lat)}) and output_lens ({len(out)}) differ in length")
        per_token = [s / n for s, n in zip(lat, out) if n > 0]
        row["normalized_latency_s"] = statistics.fmean(per_token) if per_token else None
    if completed == 0:  # every request failed: the run measured nothing
        row.update(status="error", error="no request completed")
    else:
        row["status"] = "ok"
    lists = check_each("latencies", lat, "time") + check_each("output_lens", out, "count")  # normalized_latency_s's
    return judged(row, check_consistency(row, names) + lists + check_rates(row, completed, names))
