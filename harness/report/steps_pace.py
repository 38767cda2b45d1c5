"""The pace a validating job's wall runs' own steps ran at, beside the pace its meter read for them.

A validating job prices each wall run's simulation at the machine's pace in that run, read by the pace meter
(harness/measure/pace_meter.py): a fixed unit of the model's work timed in the serving thread, against the same unit
timed while the profile was measured. The meter reads the machine while the run goes on; the run's own decode steps
say afterwards how fast they went against their prices on the job's profile (the steps table's ``price_s``): their
summed time over their summed price. Where the two part, the simulation was priced at a pace the steps did not run
at, and its error is the meter's miss (amplified by the queue near saturation) before it is the clock's: this module
puts the two side by side, so that a validation run that fails says which of them failed.

Measured on the AMD EPYC 2-core (two validation runs, of 64 and of 192 requests a rate: 40 wall runs), the meter read
its runs' paces from 15% under to 20% over their steps', by a median 3.5% and 6% in absolute value; splitting each
run's units in two halves put the meter's own sampling noise at about 3% of a run's pace (11-45 units a run in the
first, at most one every quarter second). Where a pair's wall run sat near its knee (paged_cuda at 20 req/s, in two of
the eight validation runs of that day: docs/figures.md "The meter against its runs' own steps"), the meter reading 9% and
19% slow moved its simulated E2EL by +87% and +110%.

A step's time here is what the profile times for its points: from its start to the next step's start (the engine's
pause between steps included), less a meter unit timed between them; where the next step is the first after a sleep
(its ``place`` 0, as the job judged it when it priced the steps: harness/scenarios/wall_check.py ``priced``), the
pause is the sleep, not the step's. A rate a job served twice is summed over both runs.
"""

from __future__ import annotations

import pandas as pd

from kvbench.harness.report.tables import md_text

KEYS = ["run_dir", "impl", "request_rate", "chunked_prefill"]


def _periods(run: pd.DataFrame) -> pd.Series:
    """Each step of one wall run (in order) from its start to the next one's, less a unit timed between them; its
    duration alone where the engine slept before the next (or none followed)."""
    unit = run["pace_unit_s"].fillna(0.0) if "pace_unit_s" in run else 0.0
    pause = run["start_s"].shift(-1) - (run["start_s"] + run["duration_s"] + unit)
    slept = run["place"].shift(-1) == 0
    return run["duration_s"] + pause.where((pause >= 0) & ~slept, 0.0).fillna(0.0)


def steps_pace(steps: pd.DataFrame | None) -> pd.DataFrame:
    """Per job, impl, rate and scheduling: ``steps_pace``, the wall run's decode steps' summed time over their summed
    price on the job's profile, and ``priced_steps``, how many it sums; empty where the table has no prices."""
    need = {*KEYS, "kind", "start_s", "duration_s", "price_s", "place"}
    if steps is None or steps.empty or not need <= set(steps):
        return pd.DataFrame(columns=[*KEYS, "steps_pace", "priced_steps"])
    mine = steps[steps["request_rate"].notna()].assign(
        chunked_prefill=lambda d: d["chunked_prefill"].fillna(False).astype(bool))
    out = []
    for key, g in mine.groupby(KEYS, sort=False):
        # a run's clock starts again from 0: a second run of the same rate begins where start_s goes back
        runs = (g["start_s"].diff() < 0).cumsum()
        period = pd.concat([_periods(r) for _, r in g.groupby(runs, sort=False)])
        decode = (g["kind"] == "decode") & g["price_s"].notna() & (g["price_s"] > 0)
        if decode.any():
            out.append({**dict(zip(KEYS, key)), "steps_pace": period[decode].sum() / g.loc[decode, "price_s"].sum(),
                        "priced_steps": int(decode.sum())})
    return pd.DataFrame(out, columns=[*KEYS, "steps_pace", "priced_steps"])


def with_steps_pace(pairs: pd.DataFrame, steps: pd.DataFrame | None) -> pd.DataFrame:
    """``pairs`` (harness/report/clock_validation.py ``service_pairs``) with each one's wall run's ``steps_pace`` and
    ``meter_miss``: the meter's pace over it, less 1 (NaN where either is missing)."""
    paced = steps_pace(steps)
    if pairs.empty or paced.empty or "run_dir_wall" not in pairs:
        return pairs.assign(steps_pace=float("nan"), meter_miss=float("nan"))
    chunked = pairs["chunked_prefill"].fillna(False).astype(bool) if "chunked_prefill" in pairs else False
    key = pairs.assign(chunked_prefill=chunked, run_dir=pairs["run_dir_wall"])
    got = key[KEYS].merge(paced, on=KEYS, how="left")["steps_pace"].to_numpy()
    out = pairs.assign(steps_pace=got)
    return out.assign(meter_miss=out["machine_pace"] / out["steps_pace"] - 1)


def miss_said(pairs: pd.DataFrame) -> str | None:
    """The meter's misses over ``pairs``, as a sentence's end: their median absolute value and range, machine by
    machine where the pairs are of several; None where no pair has both paces."""
    if "meter_miss" not in pairs or pairs["meter_miss"].dropna().empty:
        return None
    devices = pairs["device_slug"].dropna().unique() if "device_slug" in pairs else []
    if len(devices) < 2:
        return _said(pairs["meter_miss"].dropna())
    said = [f"{_said(g)} on {md_text(d)}" for d in sorted(devices)
            if not (g := pairs.loc[pairs["device_slug"] == d, "meter_miss"].dropna()).empty]
    return ", ".join(said)


def _said(miss: pd.Series) -> str:
    return (f"a median {100 * miss.abs().median():.0f}% off (from {100 * miss.min():+.0f}% to {100 * miss.max():+.0f}%, "
            f"{len(miss)} wall run{'s' if len(miss) > 1 else ''})")
