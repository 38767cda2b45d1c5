"""Price one published point on the simulated clock, through kvbench's own command line.

``overrides(point)`` is the command line a user would type (``python -m harness scenario=capacity ...``);
``price(point)`` runs it in a subprocess into a scratch folder and reads the figure the point publishes
from the run's requests table (``requests.csv``), computed as the published tool computes it:

- offline or a Poisson rate: a request's latencies start at its arrival;
- a closed loop at ``max_concurrency`` C (``vllm bench serve --max-concurrency C``): the client holds back
  request C+1 until one has come back whole, so its clock starts when it is sent. kvbench runs the same
  client (``arrival.max_concurrency=C``, harness/serving/client_cap.py) in front of a server that pays the
  engine profile's front-end cost (``engine.offline=false``: every request is there at t=0, but through a
  server); a request's latencies start when the client sends it (its ``arrival_s``);
- TPOT = (E2EL - TTFT) / (output tokens - 1), per request; ITL is taken as the run's decode time over its
  decode tokens (mean) or the median TPOT (p50): the requests table has no per-token times;
- output tok/s and req/s: totals over the time from the first arrival to the last finish.

An offline point (every request at once, no client cap) runs at most as many sequences as fit whole in the
KV cache (``max_concurrency_analytic`` of a one-request probe run, at most ``OFFLINE_BATCH``): TensorRT-LLM's
default scheduler (GUARANTEED_NO_EVICT) admits a request only when its whole output fits, where kvbench's
paged cache would admit more and preempt them.

Published runs of thousands of requests are capped at ``max(cap, WAVES x batch)`` (``cap`` default 300): a
closed loop's or a rate's figures move little with the count; an offline throughput needs several waves of
the batch, or its ramp and tail would weigh more than in the published run. The check stays seconds a point.
"""

from __future__ import annotations

import csv
import math
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kvbench.harness.front.clock_check_points import Point

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CAP = 300
WAVES = 6  # an offline point simulates at least this many batches' worth of requests (or all it published)
OFFLINE_BATCH = 512  # an offline run's most running sequences (TensorRT-LLM and vLLM both allow hundreds)
ONLINE_BATCH = 256  # vLLM's default max_num_seqs for a rate-limited run
# A row's engine as a conf/engine/ name: the clock's engine profile, where one exists when the check runs.
ENGINE_PROFILE = {"vllm": "vllm_v1", "vllm_v1": "vllm_v1", "vllm_v0": "vllm_v0", "trtllm": "trtllm",
                  "sglang": "sglang"}


@dataclass(frozen=True)
class Priced:
    """A point's simulated figure, or why there is none."""

    simulated: float | None
    command: str
    reason: str = ""  # empty when priced
    requests: int = 0  # how many requests were simulated


@dataclass(frozen=True)
class RequestTimes:
    """One request of a run, in seconds on the simulated clock."""

    prompt_len: int
    output_len: int
    arrival_s: float
    admitted_s: float
    first_token_s: float
    finish_s: float


def unpriceable(point: Point, repo: Path = REPO) -> str:
    """Why kvbench cannot price the point's configuration at all ('' when it can)."""
    for group, name in (("model", point.model), ("gpu", point.gpu)):
        if not (repo / "conf" / group / f"{name}.yaml").is_file():
            return f"no conf/{group}/{name}.yaml ({point.published_model if group == 'model' else name})"
    if point.engine_overrides and not _engine_profile(point, repo):  # priced without them, it would read as theirs
        return (f"engine_overrides ({' '.join(point.engine_overrides)}) override an engine profile, and "
                f"engine={point.engine} has none in conf/engine/")
    return ""


def _engine_profile(point: Point, repo: Path) -> str | None:
    """The conf/engine/ name of the row's engine, where that file exists."""
    engine = ENGINE_PROFILE.get(point.engine)
    return engine if engine and (repo / "conf" / "engine" / f"{engine}.yaml").is_file() else None


def is_offline(point: Point) -> bool:
    return math.isinf(point.request_rate) and point.max_concurrency is None


def overrides(point: Point, cap: int = DEFAULT_CAP, repo: Path = REPO, fits: int | None = None) -> list[str]:
    """The command line's overrides that reproduce the point's published configuration.

    ``fits``: how many whole sequences the KV cache holds (an offline point's probe), else None."""
    if point.max_concurrency is not None:
        batch = max(ONLINE_BATCH, point.max_concurrency)  # the server's cap; the client's is arrival.max_concurrency
    elif is_offline(point):
        batch = min(OFFLINE_BATCH, fits) if fits else OFFLINE_BATCH
    else:
        batch = ONLINE_BATCH
    n = min(point.num_requests, max(cap, WAVES * batch) if is_offline(point) else cap)
    lengths = [f"workload={point.workload}", f"workload.prompt_len={point.prompt_len}",
               f"workload.output_len={point.output_len}"]
    if point.output_len_mean is not None:  # outputs stop at EOS: uniform up to max_tokens, the published mean
        mean = point.output_len_mean
        lengths = ["workload=uniform", "workload.spread=0", f"workload.prompt_len={point.prompt_len}",
                   f"workload.output_len={mean:g}", f"workload.output_spread={(point.output_len - mean) / mean:.6g}"]
    args = ["scenario=capacity", f"model={point.model}", f"dtype={point.dtype}", f"gpu={point.gpu}",
            f"gpu.count={point.gpu_count}", *lengths, f"workload.num_requests={n}",
            f"max_seq_len={point.prompt_len + point.output_len}", f"batch={batch}", "+impl=paged", "seed=0"]
    if math.isinf(point.request_rate):
        args.append("arrival=burst")
    else:
        args += ["arrival=poisson", f"arrival.rate={point.request_rate:g}"]
    if point.max_concurrency is not None:  # a client in front: every request pays the server's front-end cost
        args += [f"arrival.max_concurrency={point.max_concurrency}", "engine.offline=false"]
    if point.weight_dtype:
        args.append(f"weight_dtype={point.weight_dtype}")
    if point.kv_dtype:
        args.append(f"kv_dtype={point.kv_dtype}")
    engine = _engine_profile(point, repo)
    if engine:
        args.append(f"engine={engine}")
        args += point.engine_overrides  # what the row's source ran where it differs from the profile's defaults
    return args


def read_requests(path: Path) -> list[RequestTimes]:
    """A run's requests.csv (one row per finished request)."""
    with open(path, newline="") as f:
        return [RequestTimes(int(r["prompt_len"]), int(r["output_len"]), float(r["arrival_s"]),
                             float(r["admitted_s"]), float(r["first_token_s"]), float(r["finish_s"]))
                for r in csv.DictReader(f) if r["finish_s"] not in ("", "nan")]


def metric_value(metric: str, reqs: list[RequestTimes]) -> float:
    """The published statistic from a run's requests (module docstring: how each is computed)."""
    if not reqs:
        raise ValueError("no finished requests to measure")
    start = [r.arrival_s for r in reqs]
    if metric in ("output_tok_s", "req_s"):
        span = max(r.finish_s for r in reqs) - min(r.arrival_s for r in reqs)
        total = sum(r.output_len for r in reqs) if metric == "output_tok_s" else len(reqs)
        return total / span
    name, _, stat = metric.rpartition("_")
    if name == "ttft_ms":
        values = [(r.first_token_s - s) * 1e3 for r, s in zip(reqs, start)]
    elif name == "e2el_ms":
        values = [(r.finish_s - s) * 1e3 for r, s in zip(reqs, start)]
    elif name in ("tpot_ms", "itl_ms"):
        decoding = [r for r in reqs if r.output_len > 1]
        if name == "itl_ms" and stat == "mean":  # every inter-token gap of the run weighs the same
            return 1e3 * sum(r.finish_s - r.first_token_s for r in decoding) / sum(r.output_len - 1 for r in decoding)
        values = [(r.finish_s - r.first_token_s) * 1e3 / (r.output_len - 1) for r in decoding]
    else:
        raise ValueError(f"metric={metric!r}: not one a requests table gives")
    return statistics.fmean(values) if stat == "mean" else statistics.median(values)


def price(point: Point, cap: int = DEFAULT_CAP, repo: Path = REPO, timeout_s: float = 120) -> Priced:
    """Run the point's command line into a scratch folder and read its figure."""
    why = unpriceable(point, repo)
    if why:
        return Priced(None, "python -m harness " + " ".join(overrides(point, cap, repo)), why)
    with tempfile.TemporaryDirectory(prefix="clock_check_") as tmp:
        fits = None
        if is_offline(point):
            probe = overrides(point, 1, repo)
            probe = [a for a in probe if not a.startswith("workload.num_requests=")] + ["workload.num_requests=1"]
            rows, error = run_args(probe, Path(tmp) / "probe", repo, timeout_s)
            if error:
                return Priced(None, "python -m harness " + " ".join(probe), error)
            fits = int(float(rows[0]["max_concurrency_analytic"]))
        args = overrides(point, cap, repo, fits)
        command = "python -m harness " + " ".join(args)
        _, error = run_args(args, Path(tmp) / "run", repo, timeout_s)
        if error:
            return Priced(None, command, error)
        reqs = read_requests(Path(tmp) / "run" / "requests.csv")
    try:
        return Priced(metric_value(point.metric, reqs), command, "", len(reqs))
    except ValueError as e:
        return Priced(None, command, str(e))


def run_args(args: list[str], folder: Path, repo: Path, timeout_s: float) -> tuple[list[dict], str]:
    """One kvbench run into ``folder``: its rows, and its error ('' when it ran and every row is ok)."""
    run = subprocess.run([sys.executable, "-m", "harness", *args, f"hydra.run.dir={folder}"], cwd=repo,
                         capture_output=True, text=True, timeout=timeout_s)
    rows: list[dict] = []
    if (folder / "rows.csv").is_file():
        with open(folder / "rows.csv", newline="") as f:
            rows = list(csv.DictReader(f))
    bad = [f"{r.get('status')}: {r.get('error', '')}" for r in rows if r.get("status") != "ok"]
    if bad or run.returncode != 0 or not rows:
        tail = bad[0] if bad else (run.stderr.strip().splitlines() or [f"exit {run.returncode}"])[-1]
        return rows, f"the run failed: {tail}"[:300]
    return rows, ""
