"""A user's ``vllm bench serve --save-result`` files as published points for ``kvbench calibrate``.

One file is one run of vLLM's benchmark: one configuration (request rate or client concurrency, prompt and output
lengths, number of prompts) and up to nine figures of it (mean and median TTFT, TPOT, ITL and E2EL, and the output
throughput). Each figure becomes a ``Point`` of the clock check's validation set (harness/front/clock_check_points.py),
so that it is priced by the same command line (harness/front/clock_check_price.py). The file does not say which GPU,
model or engine served it: the user names them (``gpu=``, ``model=``, ``engine=``), and every file of one calibration
shares them.

Lengths: the means of ``input_lens`` and ``output_lens`` where the file has them (``--save-detailed``), else the
totals over the completed requests; kvbench prices every request at those lengths (``workload=fixed``), which is
exact for vLLM's ``random`` dataset at range ratio 0 and an approximation for a spread of lengths.
``request_throughput`` is not taken: at fixed lengths it is the output throughput over the output length, and taking
both would count one figure twice.

The split (``split_points``): points are numbered in the order the files were named and, within a file, in the order
of ``METRIC_KEYS``; every k-th (number % k == k - 1, as the clock check's every third) is held out of the fit.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

from kvbench.harness.errors import ConfigError
from kvbench.harness.front.clock_check_points import Point
from kvbench.harness.results.vllm_json import looks_like_vllm

# vLLM's summary key -> the clock check's metric name (clock_check_points.METRICS), in the order points are numbered.
METRIC_KEYS = {"mean_ttft_ms": "ttft_ms_mean", "median_ttft_ms": "ttft_ms_p50",
               "mean_tpot_ms": "tpot_ms_mean", "median_tpot_ms": "tpot_ms_p50",
               "mean_itl_ms": "itl_ms_mean", "median_itl_ms": "itl_ms_p50",
               "mean_e2el_ms": "e2el_ms_mean", "median_e2el_ms": "e2el_ms_p50",
               "output_throughput": "output_tok_s"}
SOURCE = "vllm bench serve"  # a Point's engine: no conf/engine/ name, so overrides() adds no engine= of its own


@dataclass(frozen=True)
class Setup:
    """What the files do not say and the user names: where and what they ran."""

    gpu: str
    model: str
    gpu_count: int = 1
    dtype: str = "bfloat16"  # vLLM's ``--dtype auto`` for the bf16 checkpoints most models ship
    weight_dtype: str = ""  # '' = the model's dtype
    kv_dtype: str = ""


@dataclass(frozen=True)
class Run:
    """One result file: the configuration it ran (``point``: its first figure) and every figure as a Point.

    ``arrival``: overrides beyond the clock check's for arrivals it does not write (vLLM's ``--burstiness``)."""

    path: Path
    points: tuple[Point, ...]
    arrival: tuple[str, ...] = ()

    @property
    def point(self) -> Point:
        return self.points[0]


def _bad(path: Path, key: str, problem: str) -> ConfigError:
    return ConfigError(f"{path}: {key}: {problem}")


def _positive(path: Path, key: str, value, whole: bool = False) -> float:
    """A number > 0 (a whole one for a count), as the file has it; anything else names the key."""
    kind = "a whole number" if whole else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise _bad(path, key, f"{value!r} must be {kind} > 0")
    if whole and not float(value).is_integer():
        raise _bad(path, key, f"{value!r} must be {kind} > 0")
    return value


def _need(path: Path, result: dict, key: str, why: str):
    if result.get(key) is None:
        raise _bad(path, key, f"missing; kvbench needs it for {why} (vllm bench serve --save-result writes it)")
    return result[key]


def _mean_length(path: Path, result: dict, side: str, completed: int) -> int:
    """The mean ``input`` or ``output`` length: from the per-request list, else the total over completed requests."""
    lens = result.get(f"{side}_lens")
    if isinstance(lens, list) and lens:
        for i, n in enumerate(lens):  # a failed request's output length is 0 in vLLM's file
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise _bad(path, f"{side}_lens[{i}]", f"{n!r} must be a whole number >= 0")
        return max(1, round(sum(lens) / len(lens)))
    key = f"total_{side}_tokens"
    total = _need(path, result, key, f"the mean {side} length (or {side}_lens)")
    return max(1, round(_positive(path, key, total, whole=True) / completed))


def _rate(path: Path, result: dict) -> float:
    rate = _need(path, result, "request_rate", "the arrivals")
    if rate == "inf" or (isinstance(rate, float) and math.isinf(rate) and rate > 0):
        return math.inf
    return float(_positive(path, "request_rate", rate))


def _arrival(path: Path, result: dict, rate: float) -> tuple[str, ...]:
    """vLLM's gamma arrivals (``--burstiness``) where the rate is finite; Poisson (burstiness 1) needs nothing."""
    if result.get("ramp_up_strategy") is not None:
        raise _bad(path, "ramp_up_strategy", f"{result['ramp_up_strategy']!r}: a rate that changes over the run "
                                             "cannot be priced; allowed: null (one request rate)")
    shape = result.get("burstiness")
    if math.isinf(rate) or shape is None or shape == 1:
        return ()
    if isinstance(shape, float) and math.isinf(shape) and shape > 0:
        return ("arrival=constant",)
    return ("arrival=gamma", f"arrival.burstiness={_positive(path, 'burstiness', shape):g}")


def read_result(path: Path, setup: Setup) -> Run:
    """A ``vllm bench serve`` result file as a Run; a ConfigError names the file and the key it lacks or mistypes."""
    try:
        result = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: not a readable JSON file ({type(e).__name__}: {e})") from None
    if not looks_like_vllm(result):
        raise ConfigError(f"{path}: not a vllm bench serve result: it has no 'duration' and 'completed' keys "
                          "(vllm bench serve --save-result writes them)")
    completed = int(_positive(path, "completed", result["completed"], whole=True))
    prompts = result.get("num_prompts")
    num = completed if prompts is None else int(_positive(path, "num_prompts", prompts, whole=True))
    rate = _rate(path, result)
    conc = result.get("max_concurrency")
    conc = None if conc is None else int(_positive(path, "max_concurrency", conc, whole=True))
    template = Point(id="", source_url=str(path), source_date=str(result.get("date") or ""), engine=SOURCE,
                     engine_version="", gpu=setup.gpu, gpu_count=setup.gpu_count, model=setup.model,
                     published_model=str(result.get("model_id") or ""), dtype=setup.dtype,
                     weight_dtype=setup.weight_dtype, kv_dtype=setup.kv_dtype, workload="fixed",
                     prompt_len=_mean_length(path, result, "input", completed),
                     output_len=_mean_length(path, result, "output", completed), request_rate=rate,
                     num_requests=num, max_concurrency=conc, metric="", value=0.0, split="fit", note="")
    points = []
    for key, metric in METRIC_KEYS.items():
        value = result.get(key)
        if value is None:
            continue
        if metric.startswith(("tpot", "itl")) and template.output_len < 2:
            continue  # one output token: no inter-token time to compare (vLLM writes 0)
        points.append(dataclasses.replace(template, id=f"{Path(path).name}:{metric}", metric=metric,
                                          value=float(_positive(path, key, value))))
    if not points:
        raise ConfigError(f"{path}: no figure to calibrate on; expected at least one of {', '.join(METRIC_KEYS)}")
    return Run(Path(path), tuple(points), _arrival(path, result, rate))


def split_points(runs: list[Run], every: int) -> list[Run]:
    """The runs with each point's ``split``: every ``every``-th point over all files is ``holdout``, the rest ``fit``.

    ``every`` = 0 holds none out (every point is fitted; nothing checks the fit)."""
    if isinstance(every, bool) or not isinstance(every, int) or every < 0 or every == 1:
        raise ConfigError(f"--holdout-every={every!r}: allowed: 0 (no holdout) or an integer >= 2 "
                          "(1 would hold out every point and leave nothing to fit)")
    out, n = [], 0
    for run in runs:
        points = []
        for p in run.points:
            held = every and n % every == every - 1
            points.append(dataclasses.replace(p, split="holdout" if held else "fit"))
            n += 1
        out.append(dataclasses.replace(run, points=tuple(points)))
    return out


def all_points(runs: list[Run]) -> list[tuple[int, Point]]:
    """Every point with the index of its run, in the split's order."""
    return [(i, p) for i, run in enumerate(runs) for p in run.points]
