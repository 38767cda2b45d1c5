"""When each request arrives: the ``arrival`` config group.

The first request arrives at t=0; the processes differ in the gaps after it:
- ``burst``: no gaps, every request at t=0 (the runs made before arrivals existed);
- ``poisson``: exponential gaps of mean 1/rate;
- ``gamma``: Gamma(shape=burstiness, scale=1/(rate*burstiness)) gaps, vLLM's definition:
  the mean gap stays 1/rate, the coefficient of variation is 1/sqrt(burstiness), so
  burstiness 1 is Poisson (the same draws) and smaller is burstier;
- ``constant``: every gap 1/rate;
- ``trace``: the workload file's times times ``time_scale``, shifted so the first is t=0
  (the workload puts its requests in arrival order; harness/serving/trace.py).

The random gaps come from their own seeded stream, so changing the process or the rate
never changes the requests' lengths or token ids.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from kvbench.harness.config import ARRIVALS, RATE_ARRIVALS, ArrivalConfig
from kvbench.harness.errors import ConfigError

ARRIVAL_STREAM = 0xA771  # mixed with the run's seed: a stream apart from the workload's


def arrival_times(cfg: ArrivalConfig, count: int, seed: int, trace_s: Sequence[float] | None = None) -> list[float]:
    """Seconds after the run starts at which each of ``count`` requests arrives (non-decreasing
    for every process but ``trace``, which keeps the order it is given)."""
    if count == 0:
        return []
    if cfg.name == "burst":
        return [0.0] * count
    if cfg.name == "trace":
        if trace_s is None:
            raise ConfigError("arrival=trace needs arrival times from the workload: workload=trace with a "
                              "workload.columns.arrival_s column")
        if len(trace_s) != count:
            raise ValueError(f"{len(trace_s)} trace arrival times for {count} requests")
        start = min(trace_s)
        return [(t - start) * cfg.time_scale for t in trace_s]
    if cfg.name not in RATE_ARRIVALS:
        raise ConfigError(f"arrival.name={cfg.name!r} is not allowed; allowed: {', '.join(ARRIVALS)}")
    if cfg.rate is None or not cfg.rate > 0:
        raise ConfigError(f"arrival.rate={cfg.rate} must be > 0 requests per second for arrival={cfg.name}")
    if cfg.name == "constant":
        return (np.arange(count) / cfg.rate).tolist()
    shape = 1.0 if cfg.name == "poisson" else cfg.burstiness
    if not shape > 0:
        raise ConfigError(f"arrival.burstiness={cfg.burstiness} must be > 0")
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, ARRIVAL_STREAM])))
    gaps = rng.gamma(shape, 1.0 / (cfg.rate * shape), size=count - 1)
    return [0.0, *np.cumsum(gaps).tolist()]


def ignored_rate_note(cfg: ArrivalConfig) -> str | None:
    """A row's note when ``arrival.rate`` was set for a process that does not read it (burst, trace).

    Not an error: a sweep such as ``arrival=burst,poisson arrival.rate=40`` sets the rate for every
    job on purpose. The schema's default rate is None, so a rate here was set by the user.
    """
    if cfg.rate is None or cfg.name in RATE_ARRIVALS:
        return None
    why = {"burst": "arrival=burst sends every request at t=0",
           "trace": "arrival=trace takes the file's times (arrival.time_scale scales them)"}.get(cfg.name, "")
    return f"arrival.rate={cfg.rate:g} ignored: {why or f'arrival={cfg.name} reads no rate'}"
