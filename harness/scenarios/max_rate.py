"""scenario=max_rate: the largest arrival.rate at which an impl passes the SLO.

The benchmark's answer to "how much more traffic does paging serve on this GPU"
(the PagedAttention paper's Figure 12 headline). Each probe serves the workload
with arrivals at one rate and checks the SLO (``slo``: percentiles of TTFT, TPOT,
E2EL and the mean normalized latency); the search doubles the rate from
``scenario.start_rps`` until a probe fails (or ``scenario.search_limit``), then
bisects until the bracket is narrower than ``scenario.tolerance_rps``. Every
probe is listed in the run's ``rate_probes`` table.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from kvbench.harness.config import ImplConfig, SearchScenario

if TYPE_CHECKING:  # reading a config imports this module; running it loads torch
    from kvbench.harness.scenarios.compute import Compute
    from kvbench.harness.scenarios.job_run import JobRun
    from kvbench.harness.scenarios.outputs import Outputs


@dataclass
class MaxRateScenario(SearchScenario):
    """The largest arrival rate that passes the SLO (harness/scenarios/max_rate.py)."""

    name: str = "max_rate"
    warmup: int = 1  # warm-up passes before the first decode probe (the later ones find everything warm)
    start_rps: float = 1.0  # the first rate probed (then doubled until the SLO fails, then bisected)
    tolerance_rps: float = 0.25  # stop bisecting when the bracket is this narrow
    search_limit: float = 256  # the highest rate probed (req/s)


SCHEMA = MaxRateScenario

# The probe's columns kept in the rate_probes table (and, for the best passing probe, in the row).
PROBE_COLUMNS = ("request_rate", "achieved_rps", "normalized_latency_s", "goodput_rps", "slo_attainment",
                 "ttft_ms_p99", "tpot_ms_p99", "e2el_ms_p99", "preemptions", "peak_concurrency", "gpu",
                 "clock_source")  # simulated probes: what priced their steps (a profile's id, or roofline-v<N>)


def probe_record(impl: str, rid: str, rate: float, row: dict, clock: str | None = None) -> dict:
    """One probe's line of the ``rate_probes`` table: its rate, verdict and ``PROBE_COLUMNS``; ``clock``
    (wall | simulated) where one job searches on both (scenario=profile's validation)."""
    record = {"impl": impl, "run_id": rid, "rate_rps": rate, "slo_pass": bool(row.get("slo_pass")),
              **{k: row.get(k) for k in PROBE_COLUMNS}}
    return record if clock is None else {**record, "clock": clock}


def search_rate(passes: Callable[[float], bool], start: float, limit: float, tolerance: float) -> tuple[float, int]:
    """(largest passing rate found, probes run): double from ``start``, then bisect to ``tolerance``.

    0.0 when no rate down to ``tolerance`` passes; ``limit`` caps the doubling and is probed itself.
    """
    good, bad, probes = 0.0, None, 0
    rate = min(start, limit)
    while True:
        probes += 1
        if not passes(rate):
            bad = rate
            break
        good = rate
        if rate >= limit:
            return good, probes  # the limit itself passes
        rate = min(rate * 2, limit)
    while bad - good > tolerance:
        mid = (good + bad) / 2
        probes += 1
        if passes(mid):
            good = mid
        else:
            bad = mid
    return good, probes


def _probe(job: JobRun, compute: Compute, impl: ImplConfig, rate: float, first: bool) -> dict:
    from kvbench.harness.scenarios.context import probe

    cfg = copy.deepcopy(job.cfg)
    cfg.arrival.rate = rate
    cfg.repeat = 1
    at_rate = probe(job, compute, cfg)
    if cfg.scenario.probe == "capacity":  # the simulated clock (gpu=NAME): bookkeeping at full scale
        from kvbench.harness.scenarios.capacity import simulated_row

        return at_rate.call(simulated_row, impl)
    from kvbench.harness.scenarios import decode

    # kernels and caches are warm after the first probe
    (row,) = at_rate.call(decode.measure, impl, warmup=cfg.scenario.warmup if first else 0)
    return row


def run(job: JobRun, compute: Compute, out: Outputs, impl: ImplConfig) -> list[dict]:
    import pandas as pd

    from kvbench.harness.serving.service_metrics import slo_label
    from kvbench.harness.serving.timeline import append_table

    sc = job.cfg.scenario
    listed: list[dict] = []
    mode: dict = {}
    if sc.probe == "decode":
        # cuda_graph=true: built (captured on a GPU) by reading them, once, here; every probe keeps the
        # batch, so each probe's compute shares them (Compute.shared_with) instead of capturing its own.
        compute.decode_pieces
        mode = compute.decode_mode_columns()  # cpu_compile: compiled once here, likewise kept by every probe

    def passes(rate: float) -> bool:
        row = _probe(job, compute, impl, rate, first=not listed)
        listed.append(probe_record(impl.name, job.run_id, rate, row))
        return bool(row.get("slo_pass"))

    found, probes = search_rate(passes, sc.start_rps, sc.search_limit, sc.tolerance_rps)
    append_table(out.tables, "rate_probes", pd.DataFrame(listed))
    best = next((p for p in listed if p["rate_rps"] == found and p["slo_pass"]), {})
    notes = [f"probe={sc.probe}; {probes} probes"]
    if found >= sc.search_limit:
        notes.append(f"reached scenario.search_limit={sc.search_limit}")
    if not found:
        notes.append(f"no rate down to scenario.tolerance_rps={sc.tolerance_rps} passed the SLO")
    return [{
        "status": "ok",
        "notes": "; ".join(notes),
        "arrival": job.cfg.arrival.name,
        "slo": slo_label(job.cfg.slo),
        "clock": "simulated" if sc.probe == "capacity" else "wall",
        "gpu": best.get("gpu"),
        "max_rate_rps": found,
        "probes": probes,
        **{k: best.get(k) for k in PROBE_COLUMNS if k != "request_rate"},
        "request_rate": found or None,
        **mode,
    }]
