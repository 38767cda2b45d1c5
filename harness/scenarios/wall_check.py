"""The wall-clock half of the simulated clock's validation, served in the profile's own process.

``scenario=profile`` with ``scenario.wall=true`` serves its workload for real at each rate it
simulates (and searches the max rate within the SLO on the wall clock), right after it measured
the profile, with the same model object, so both clocks see one machine state. Measured on the
2-core CPU machines here: the same code's step times differ by 5-15% from one process to the next
(the same profile measured in three fresh processes, minutes apart), and by 1-3% within one
process over the minutes a validation takes (5-15% in some jobs since, with no other process in sight).
A profile taken in one process and wall runs taken in another compare two states of the machine, not the
clock with the wall. The job spreads its profile's passes over its wall runs (harness/scenarios/profile.py
``run``), so that the profile samples the machine over the minutes they do, and records how far the
machine moved from its first pass to its last (``profile_drift``).

A wall row here is the row ``scenario=decode`` writes for the same config at that rate (its
``clock`` is ``wall``); the report pairs it with the simulated row of the same job and rate.
"""

from __future__ import annotations

import copy
import functools
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from kvbench.harness.config import ImplConfig

if TYPE_CHECKING:  # reading a config imports this module; running it loads torch
    import pandas as pd

    from kvbench.harness.measure.pace_meter import Unit
    from kvbench.harness.scenarios.compute import Compute
    from kvbench.harness.scenarios.context import JobContext
    from kvbench.harness.scenarios.job_run import JobRun
    from kvbench.harness.scenarios.outputs import Outputs

WALL_NOTE = "served on the wall clock by scenario=profile's validation, in the profile's process"


def at_rate(job: JobRun, compute: Compute, rate: float, chunked_budget: int | None = None,
            tables: bool = True) -> JobContext:
    """A probe's pieces serving the job's workload at ``rate`` (its arrival times); with ``chunked_budget``,
    scheduled with chunked prefill under that many tokens a step. The built model is shared."""
    from kvbench.harness.scenarios.context import probe

    cfg = copy.deepcopy(job.cfg)
    cfg.arrival.rate = rate
    if chunked_budget is not None:
        cfg.chunked_prefill, cfg.max_num_batched_tokens = True, chunked_budget
    cfg.timeline_tables = cfg.timeline_tables and tables
    return probe(job, compute, cfg)


def probe_identifiers(probe: JobContext, impl: ImplConfig) -> dict:
    """The identifiers a probe's row differs in from the job's: the workload at its rate (its arrival
    times) and its scheduling."""
    ids = probe.identifiers(impl)
    return {k: ids[k] for k in ("workload_digest", "chunked_prefill", "max_num_batched_tokens")}


def priced(steps: pd.DataFrame, clock) -> pd.DataFrame:
    """The steps table (one wall run's, in order) with ``place``, each step's place since the engine last slept,
    ``after_busy``, its place since the busy prefill it follows (empty where its price counts from the sleep), and
    ``price_s``: what ``clock`` (the job's profile) prices each decode and prefill step at, its shape's price times
    its place's after-idle factor (harness/serving/after_idle.py), as the simulation prices it, beside its wall
    ``duration_s`` (a mixed step's split into decodes and chunk is not recorded: left empty)."""
    from kvbench.harness.serving.after_idle import AfterIdle, places, step_factors

    after = clock.after_idle or AfterIdle(1.0, ((1, 1.0),))  # no factors: every place at 1
    # a pace meter's unit timed right after a step (``pace_unit_s``) is the engine's time, not a sleep
    busy = steps["duration_s"] + (steps["pace_unit_s"].fillna(0.0) if "pace_unit_s" in steps else 0.0)
    chunked = steps["chunked_prefill"].astype(bool) if "chunked_prefill" in steps else False
    # a step of prompt chunks alone is a chunk (no busy prefill), as the simulator prices it (sim_chunked.py)
    kinds = steps["kind"].where(~((steps["kind"] == "prefill") & chunked), "chunk")
    where = step_factors(after, kinds.tolist(), steps["start_s"].tolist(), busy.tolist())

    def price(kind: str, batch: int, tokens: int, read, factor: float) -> float | None:
        if kind == "decode":
            return clock.decode_s(int(batch), int(read)) * factor
        return clock.prefill_s(int(tokens)) * factor if kind in ("prefill", "chunk") else None

    return steps.assign(place=places(steps["start_s"].tolist(), busy.tolist()),
                        after_busy=[float(k) if b else None for k, b, _ in where], price_s=[
        price(k, b, t, r, f) for k, b, t, r, (_, _, f) in
        zip(kinds, steps["batch"], steps["tokens"], steps["kv_tokens_read"], where)])


def wall_row(job: JobRun, compute: Compute, out: Outputs, impl: ImplConfig, rate: float,
             chunked_budget: int | None = None, warmup: int = 0) -> tuple[dict, pd.DataFrame | None]:
    """The job's workload served at ``rate`` on the wall clock: scenario=decode's row, and its steps table
    with the rate and scheduling that tell it apart (for ``priced`` once the job's profile is whole; None when
    the run keeps no timeline tables, ``timeline_tables=false``). Its requests table goes into the job's, told
    apart alike."""
    from kvbench.harness.scenarios import decode
    from kvbench.harness.serving.timeline import append_table

    probe = at_rate(job, compute, rate, chunked_budget)
    (row,) = probe.call(decode.measure, impl, warmup=warmup)
    told = {"request_rate": rate, "chunked_prefill": probe.job.cfg.chunked_prefill}
    for name, frame in probe.out.tables.items():
        if name != "steps":
            append_table(out.tables, name, frame.assign(**told))
    steps = probe.out.tables.get("steps")
    notes = " | ".join(n for n in (WALL_NOTE, row.get("notes")) if n)
    return {**row, **probe_identifiers(probe, impl), "notes": notes}, (None if steps is None else steps.assign(**told))


def wall_max_rate(job: JobRun, compute: Compute, impl: ImplConfig, served: dict[float, dict] | None = None,
                  listed: list[dict] | None = None) -> dict:
    """The largest rate within the SLO on the wall clock, searched as scenario=max_rate does (no steps
    or requests tables; each probe goes into ``listed``, the job's ``rate_probes``, with ``clock=wall``).

    ``served``: rate -> the job's own wall row at that rate (whole prompts, the search's scheduling).
    The search takes its verdict instead of serving the same requests at the same rate again: the
    same question, asked of the same process minutes apart (on the CPU validation, about 20 s of
    arrivals a job)."""
    from kvbench.harness.scenarios import decode
    from kvbench.harness.scenarios.max_rate import probe_record, search_rate
    from kvbench.harness.serving.service_metrics import slo_label

    sc = job.cfg.scenario
    known = dict(served or {})
    reused = 0

    def passes(rate: float) -> bool:
        nonlocal reused
        if rate in known:
            reused += 1
            row = known[rate]
        else:
            (row,) = at_rate(job, compute, rate, tables=False).call(decode.measure, impl, warmup=0)
        if listed is not None:
            listed.append(probe_record(impl.name, job.run_id, rate, row, "wall"))
        return bool(row.get("slo_pass"))

    found, probes = search_rate(passes, sc.start_rps, sc.search_limit, sc.tolerance_rps)
    taken = f" ({reused} of them the rows served above at those rates)" if reused else ""
    return {"status": "ok", "clock": "wall", "arrival": job.cfg.arrival.name, "slo": slo_label(job.cfg.slo),
            "max_rate_rps": found, "probes": probes, "request_rate": found or None,
            "notes": f"max rate within the SLO on the wall clock; {probes} probes{taken} | {WALL_NOTE}"}


@dataclass
class WallRuns:
    """The wall half of a validating profile job: each of ``runs`` (rate, chunked budget or None) served, then
    (``search``) the max rate searched, as tasks the job runs between its profile's passes; what they left:
    each rate's row, their steps tables (to be ``priced`` once the profile is whole), the search's row, and its
    probes in ``listed`` (the job's rate_probes table, which the simulated search adds to)."""

    job: JobRun
    compute: Compute
    out: Outputs  # the job's: each rate's requests table goes into it
    impl: ImplConfig
    runs: list[tuple[float, int | None]]
    search: bool
    rows: dict[int, dict] = field(default_factory=dict)  # by index in ``runs`` (a rate may come twice)
    steps: list[pd.DataFrame] = field(default_factory=list)
    searched: dict | None = None
    listed: list[dict] = field(default_factory=list)
    served: dict[float, dict] = field(default_factory=dict)  # whole-prompt rows, whose verdicts the search reuses
    # the pace meter's units timed during each run (by index in ``runs``) and during the search
    # (harness/measure/pace_meter.py; empty without one: compute.pace)
    paced: dict[int, list[Unit]] = field(default_factory=dict)
    search_paced: list[Unit] = field(default_factory=list)
    _served_run: dict[float, int] = field(default_factory=dict)  # rate -> the index in ``runs`` of its ``served`` row

    def tasks(self) -> list[Callable[[], None]]:
        """Each rate served (the first with a warm-up), then the search."""
        out = [functools.partial(self._serve, i) for i in range(len(self.runs))]
        return out + ([self._search] if self.search else [])

    def _serve(self, i: int) -> None:
        rate, budget = self.runs[i]
        meter = self.compute.pace
        start = meter.mark() if meter is not None else (0, 0)
        row, frame = wall_row(self.job, self.compute, self.out, self.impl, rate, budget, warmup=int(i == 0))
        self.paced[i] = meter.since(start) if meter is not None else []
        if frame is not None and meter is not None:  # where a unit was timed between two steps: no sleep
            frame = frame.assign(pace_unit_s=frame.index.map(meter.after_steps(start)).astype(float))
        self.rows[i] = row
        if frame is not None:
            self.steps.append(frame)
        if budget is None and row.get("status") == "ok" and row.get("slo_pass") is not None:
            self.served[float(rate)] = row
            self._served_run[float(rate)] = i

    def _search(self) -> None:
        meter = self.compute.pace
        start = meter.mark() if meter is not None else (0, 0)
        first = len(self.listed)
        self.searched = wall_max_rate(self.job, self.compute, self.impl, self.served, self.listed)
        if meter is None:
            return
        # the search's own probes' units, and those of the runs whose verdicts it took instead of serving again
        taken = {float(p["rate_rps"]) for p in self.listed[first:]} & set(self._served_run)
        self.search_paced = meter.since(start) + [t for r in sorted(taken) for t in self.paced[self._served_run[r]]]


def drift(before: list[dict], after: list[dict]) -> float | None:
    """Median over the points timed again (a later pass, or a re-timing at the job's end) of (seconds after /
    seconds before) - 1."""
    key = ("kind", "batch", "context", "tokens")
    first = {tuple(p[k] for k in key): p["seconds"] for p in before}
    ratios = [p["seconds"] / first[k] for p in after if (k := tuple(p[k] for k in key)) in first and first[k] > 0]
    return statistics.median(ratios) - 1 if ratios else None
