"""Service metrics of one run: per-request latency, SLO attainment and goodput (vLLM's definitions).

Works on plain timelines, whatever produced them: the decode engine on the wall
clock, or the capacity simulator on its simulated clock. All times are seconds
from the run's start.

Per request (a request with ``n`` parallel samples is one request):
- TTFT  = first token - arrival            (the earliest of its samples)
- E2EL  = finish - arrival                 (the latest of its samples)
- TPOT  = (E2EL - TTFT) / (output tokens - 1)   (undefined for one output token)
- queue = admitted - arrival               (first admission)
- normalized latency = E2EL / output tokens     (the PagedAttention paper's s/token;
  the row's figure is its mean over requests)
Per sequence: ITL = every gap between consecutive tokens (a preemption's stall included).

Goodput (DistServe's definition, as in vLLM): requests meeting every set SLO, per
second of the run. ``slo_pass``: the chosen percentile of TTFT, TPOT and E2EL is
within each set limit, and the mean normalized latency within its bound.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from functools import cache
from typing import Iterable, Sequence as Seq

from kvbench.harness.config import ArrivalConfig, SloConfig
from kvbench.harness.measure.metrics import percentile, percentiles
from kvbench.harness.serving.sequence import Sequence
from kvbench.harness.serving.workload import Request

STATS = ("mean", "p50", "p90", "p99")
QS = (50, 90, 99)  # the percentiles in STATS
LATENCIES = ("ttft", "tpot", "itl", "e2el", "queue")  # each gives <name>_ms_{mean,p50,p90,p99}


@dataclass(frozen=True)
class RequestTiming:
    request_id: int
    samples: int
    prompt_len: int
    output_len: int  # tokens per sample
    arrival_s: float
    admitted_s: float
    first_token_s: float  # earliest over samples
    finish_s: float  # latest over samples
    preemptions: int
    itl_s: tuple[float, ...]  # gaps between consecutive tokens, every sample

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def e2el_s(self) -> float:
        return self.finish_s - self.arrival_s

    @property
    def queue_s(self) -> float:
        return self.admitted_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        return (self.e2el_s - self.ttft_s) / (self.output_len - 1) if self.output_len > 1 else None

    @property
    def normalized_latency_s(self) -> float:
        return self.e2el_s / self.output_len


def request_timings(finished: Iterable[Sequence]) -> list[RequestTiming]:
    """One timing per request from its finished sequences (samples grouped by request id)."""
    by_request: dict[int, list[Sequence]] = {}
    for s in finished:
        by_request.setdefault(s.request_id, []).append(s)
    out = []
    for rid in sorted(by_request):
        seqs = by_request[rid]
        first = seqs[0]
        out.append(RequestTiming(
            request_id=rid,
            samples=len(seqs),
            prompt_len=len(first.prompt_ids),
            output_len=first.output_len,
            arrival_s=first.arrival_s,
            admitted_s=min(s.admitted_s for s in seqs),
            first_token_s=min(s.first_token_s for s in seqs),
            finish_s=max(s.finish_s for s in seqs),
            preemptions=sum(s.preempted for s in seqs),
            itl_s=tuple(b - a for s in seqs for a, b in zip(s.token_s, s.token_s[1:])),
        ))
    return out


def weighted_percentiles(values: Seq[float], counts: Seq[int], qs: Seq[float]) -> list[float | None]:
    """``percentile`` at each of ``qs`` of the multiset holding each value ``counts`` times, without
    expanding it (``metrics.percentiles`` with counts)."""
    return percentiles(values, qs, counts)


def weighted_percentile(values: Seq[float], counts: Seq[int], q: float) -> float | None:
    """``percentile`` of the multiset holding each value ``counts`` times, without expanding it."""
    return weighted_percentiles(values, counts, [q])[0]


def _weighted_stats(name: str, seconds: Seq[float], counts: Seq[int]) -> dict:
    total = sum(counts)
    if not total:
        return {f"{name}_ms_{k}": None for k in STATS}
    ms_values = [v * 1e3 for v in seconds]
    return {f"{name}_ms_mean": sum(v * c for v, c in zip(ms_values, counts)) / total,
            **{f"{name}_ms_p{q}": v for q, v in zip(QS, weighted_percentiles(ms_values, counts, QS))}}


def _stats(name: str, seconds: Seq[float]) -> dict:
    vals = [v * 1e3 for v in seconds]
    if not vals:
        return {f"{name}_ms_{k}": None for k in STATS}
    return {f"{name}_ms_mean": statistics.fmean(vals),
            **{f"{name}_ms_p{q}": v for q, v in zip(QS, percentiles(vals, QS))}}


def meets_slo(t: RequestTiming, slo: SloConfig) -> bool:
    """Whether one request met every set limit (its own normalized latency against the bound)."""
    checks = [
        (slo.ttft_ms, t.ttft_s),
        (slo.tpot_ms, t.tpot_s),
        (slo.e2el_ms, t.e2el_s),
    ]
    ok = all(v is None or limit is None or v * 1e3 <= limit for limit, v in checks)
    if slo.normalized_latency_s is not None:
        ok = ok and t.normalized_latency_s <= slo.normalized_latency_s
    return ok


def slo_set(slo: SloConfig) -> bool:
    return any(v is not None for v in (slo.ttft_ms, slo.tpot_ms, slo.e2el_ms, slo.normalized_latency_s))


PERCENTILE_BOUNDS = ("ttft_ms", "tpot_ms", "e2el_ms")  # held at slo.percentile; normalized_latency_s is a mean


def _bounds(slo: SloConfig) -> tuple:
    """What the SLO checks: each set limit, and the percentile when a limit is held at one."""
    limits = tuple((k, float(getattr(slo, k))) for k in (*PERCENTILE_BOUNDS, "normalized_latency_s")
                   if getattr(slo, k) is not None)
    held_at = float(slo.percentile) if any(getattr(slo, k) is not None for k in PERCENTILE_BOUNDS) else None
    return limits, held_at


@cache
def _slo_presets() -> dict[str, tuple]:
    """conf/slo/NAME.yaml: each preset's bounds, by name."""
    from omegaconf import OmegaConf

    from kvbench.harness.paths import CONF_DIR

    out = {}
    for path in sorted((CONF_DIR / "slo").glob("*.yaml")):
        preset = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(SloConfig), OmegaConf.load(path)))
        out[path.stem] = _bounds(preset)
    return out


def slo_label(slo: SloConfig) -> str | None:
    """The row's ``slo`` column: what the run was held to, whatever name the config carries.

    - None when no limit is set (``slo=none``: no goodput, attainment or pass columns);
    - a preset's name (conf/slo/NAME.yaml) when the limits and percentile are exactly that preset's
      (the chosen ``slo.name`` first, then any other preset): ``interactive``;
    - else the limits themselves, in a fixed order: the percentile limits as ``KEY<=VALUE`` joined by
      ``,`` then ``@pQ`` (the percentile they are held at), then the mean normalized-latency bound;
      every key as the ``slo.KEY`` override names it, values as ``%.12g``. For example
      ``tpot_ms<=10@p50``, ``ttft_ms<=100,tpot_ms<=50@p99``, ``normalized_latency_s<=0.1``,
      ``ttft_ms<=2000@p99,normalized_latency_s<=0.1``.

    So overriding one limit of a preset (``slo=interactive slo.tpot_ms=50``) or naming custom limits
    (``slo.name=my-slo slo.ttft_ms=100``) labels the run by the limits it was really held to.
    """
    if not slo_set(slo):
        return None
    bounds = _bounds(slo)
    presets = _slo_presets()
    for name in (slo.name, *presets):
        if presets.get(name) == bounds:
            return name
    limits, held_at = bounds
    held = ",".join(f"{k}<={v:.12g}" for k, v in limits if k in PERCENTILE_BOUNDS)
    parts = ([f"{held}@p{held_at:.12g}"] if held else []) + [f"{k}<={v:.12g}" for k, v in limits
                                                           if k not in PERCENTILE_BOUNDS]
    return ",".join(parts)


def slo_passes(row: dict, slo: SloConfig) -> bool:
    """The run passes when the chosen percentile of each latency is within its limit
    and the mean normalized latency within its bound (the paper's criterion)."""
    q = slo.percentile
    for name, limit in (("ttft", slo.ttft_ms), ("tpot", slo.tpot_ms), ("e2el", slo.e2el_ms)):
        if limit is None:
            continue
        value = row.get(f"{name}_q_ms")  # None: no request defines it (e.g. TPOT of 1-token outputs)
        if value is not None and value > limit:
            return False
    bound = slo.normalized_latency_s
    return bound is None or (row.get("normalized_latency_s") is not None and row["normalized_latency_s"] <= bound)


def summarize(timings: list[RequestTiming], offered: int, duration_s: float, slo: SloConfig,
              itl: tuple[Seq[float], Seq[int]] | None = None) -> dict:
    """The row's service columns (the percentile columns, goodput and SLO verdict).

    ``offered`` counts every request of the workload: one that never finished
    (rejected) misses the SLO, and a run with such a request does not pass. ``itl``, when
    given, is every inter-token gap as (seconds, count) pairs (the simulator's); otherwise
    the gaps come from each sequence's token times.
    """
    row: dict = {}
    for name in LATENCIES:
        if name == "itl" and itl is not None:
            row.update(_weighted_stats(name, *itl))
            continue
        if name == "itl":
            values = [g for t in timings for g in t.itl_s]
        else:
            values = [v for t in timings if (v := getattr(t, f"{name}_s")) is not None]
        row.update(_stats(name, values))
        if name != "itl":
            q = percentile([v * 1e3 for v in values], slo.percentile)
            row[f"{name}_q_ms"] = q  # internal: the SLO's percentile, dropped before the row is written
    row["normalized_latency_s"] = statistics.fmean(t.normalized_latency_s for t in timings) if timings else None
    row["duration_s"] = duration_s
    row["achieved_rps"] = len(timings) / duration_s if duration_s > 0 else None
    if slo_set(slo):
        met = sum(meets_slo(t, slo) for t in timings)
        row["slo_attainment"] = met / offered if offered else None
        row["goodput_rps"] = met / duration_s if duration_s > 0 else None
        row["slo_pass"] = slo_passes(row, slo) and len(timings) == offered > 0
    for name in LATENCIES:
        row.pop(f"{name}_q_ms", None)
    return row


def offered_rate(arrival: ArrivalConfig, requests: Seq[Request]) -> float | None:
    """The request rate offered: the configured rate, a trace's own (requests over its span), none for a burst."""
    if arrival.name == "burst":
        return None
    if arrival.rate is not None and arrival.name != "trace":
        return arrival.rate
    span = max(r.arrival_s for r in requests) - min(r.arrival_s for r in requests)
    return (len(requests) - 1) / span if span > 0 else None


def service_columns(cfg_arrival: ArrivalConfig, slo: SloConfig, requests: Seq[Request],
                    finished: Iterable[Sequence], duration_s: float, idle_s: float, clock: str,
                    itl: tuple[Seq[float], Seq[int]] | None = None) -> dict:
    """Every service column of a row: arrival, rates, latency percentiles, goodput, SLO verdict."""
    return {
        "arrival": cfg_arrival.name,
        "request_rate": offered_rate(cfg_arrival, requests),
        "clock": clock,
        "slo": slo_label(slo),
        "idle_s": idle_s,
        **summarize(request_timings(finished), len(requests), duration_s, slo, itl),
    }
