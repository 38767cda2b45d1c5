"""CLI: ``python -m harness.report.clock_runs RUN... [--within F]``: the clock's validation over several runs.

One validation run (the clock sweeps, ``make clock-runs`` runs them) gives one median error per figure, and on the
shared 2-core machines that median moves from run to run (TPOT 4-15% over seven runs of the same design on the
Intel one: docs/figures.md). So the validation is published as several runs: each RUN (a folder holding one run's
run folders, searched as the report searches) gives, per machine, the medians the report gives
(harness/report/clock_validation.py ``summary``, chunked prefill apart): at the machine's pace in each wall run where
the jobs measured it, and at the profile's own prices; then each figure's median over the runs and their range, and
the most runs in a row whose TPOT and E2EL medians are both within ``--within`` (issue 46 asks three within 10%).
The runs are taken in the order given. Markdown on stdout; every name taken from a folder is escaped as the report
escapes it (a results folder is data). Exit 0 with the table, 1 when no RUN held a validated pair, 2 for a bad
argument.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kvbench.harness.console import OneLineParser, quiet_when_closed
from kvbench.harness.report.clock_validation import rate_pairs, service_pairs, summary
from kvbench.harness.report.collect import collect
from kvbench.harness.report.steps_pace import with_steps_pace
from kvbench.harness.report.tables import md_table, md_text
from kvbench.harness.report.variance import parse_fraction

FIGURES = {"tpot_ms_p50": "TPOT", "e2el_ms_p50": "E2EL", "ttft_ms_p50": "TTFT", "max_rate_rps": "max rate"}
GOALS = ("tpot_ms_p50", "e2el_ms_p50")  # the figures a run must hold within the bound (issue 46)
DEFAULT_WITHIN = 0.10
MISS, WORST = "meter miss", "worst miss"


@dataclass(frozen=True)
class RunMedians:
    """One run's median absolute errors on one machine (harness/report/clock_validation.py ``summary``)."""

    run: str
    device: str
    paced: dict[str, float]  # each simulation at the machine's pace in its wall run; empty where none was measured
    own: dict[str, float]  # at the profile's own prices, drifted jobs out
    # the median over the run's paced wall runs of |the meter's pace over their own steps' - 1|
    # (harness/report/steps_pace.py); None where the run's steps tables hold no prices
    meter_miss: float | None = None
    meter_worst: float | None = None  # the largest of them

    @property
    def headline(self) -> dict[str, float]:
        """The medians the report leads with: at the machine's pace where the jobs measured it."""
        return self.paced or self.own

    def within(self, bound: float) -> bool:
        return all(g in self.headline and self.headline[g] <= bound for g in GOALS)


def run_medians(run: str, rows: pd.DataFrame, steps: pd.DataFrame | None = None) -> list[RunMedians]:
    """``rows`` (one run's) as one RunMedians per machine that has a validated pair, without chunked prefill; with
    the run's ``steps`` tables, how far its meter missed its wall runs' own steps (every paced run, chunked too: the
    meter's reading does not depend on the scheduling)."""
    pairs, rates = service_pairs(rows), rate_pairs(rows)
    if pairs.empty:
        return []
    pairs = with_steps_pace(pairs, steps)
    misses = {d: g["meter_miss"].dropna().abs() for d, g in pairs.groupby("device_slug")} if "device_slug" in pairs else {}
    if "chunked_prefill" in pairs:
        pairs = pairs[~pairs["chunked_prefill"].fillna(False).astype(bool)]
    out = []
    for device in sorted(pairs["device_slug"].dropna().unique()) if "device_slug" in pairs else []:
        mine = pairs[pairs["device_slug"] == device]
        its = rates[rates["device_slug"] == device] if not rates.empty and "device_slug" in rates else rates
        own, paced = summary(mine, its), summary(mine, its, paced=True)
        miss = misses.get(device, pd.Series(dtype=float))
        if own or paced:
            out.append(RunMedians(run, str(device), paced, own, *((float(miss.median()), float(miss.max()))
                                                                   if len(miss) else (None, None))))
    return out


def in_a_row(runs: list[RunMedians], bound: float) -> int:
    """The most consecutive runs (of one machine, in order) within ``bound`` on every goal."""
    best = streak = 0
    for r in runs:
        streak = streak + 1 if r.within(bound) else 0
        best = max(best, streak)
    return best


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.0f}%"


def _columns(paced: bool) -> list[tuple[str, str, str]]:
    """(column, figure, which medians) of a machine's table: at pace and at the profile's own prices where the jobs
    measured a pace, the profile's own alone where none did."""
    if not paced:
        return [(name, f, "own") for f, name in FIGURES.items()]
    return [(f"{name} {which}", f, attr) for f, name in FIGURES.items()
            for which, attr in (("at pace", "paced"), ("own", "own"))]


def report(runs: list[RunMedians], bound: float) -> str:
    """Per machine: each run's medians, each figure's median over the runs and range, and the runs in a row."""
    parts, verdict = [], f"within {100 * bound:.0f}%"
    for device in sorted({r.device for r in runs}):
        mine = [r for r in runs if r.device == device]
        paced = any(r.paced for r in mine)
        columns = _columns(paced)
        checked = any(r.meter_miss is not None for r in mine)
        rows = [{"run": r.run, **{col: _pct(getattr(r, attr).get(f)) for col, f, attr in columns},
                 **({MISS: _pct(r.meter_miss), WORST: _pct(r.meter_worst)} if checked else {}),
                 verdict: "yes" if r.within(bound) else "no"} for r in mine]  # md_table escapes each text cell
        spread = {"run": f"median of {len(mine)} (range)"}
        listed = [(col, [getattr(r, attr)[f] for r in mine if f in getattr(r, attr)]) for col, f, attr in columns]
        if checked:
            listed += [(MISS, [r.meter_miss for r in mine if r.meter_miss is not None]),
                       (WORST, [r.meter_worst for r in mine if r.meter_worst is not None])]
        for col, values in listed:
            spread[col] = f"{_pct(statistics.median(values))} ({_pct(min(values))}-{_pct(max(values))})" if values else "–"
        spread[verdict] = f"{sum(r.within(bound) for r in mine)} of {len(mine)}"
        goals = " and ".join(FIGURES[g] for g in GOALS) + (" at pace" if paced else "")
        parts += [f"### {md_text(device)}\n\n{len(mine)} validation runs: the median absolute error below saturation "
                  "of each, without chunked prefill"
                  + (" (`at pace`: each simulation priced at the machine's pace in its wall run; `own`: at the "
                     "profile's own prices, drifted jobs out)" if paced else "")
                  + f". A run is {verdict} when its {goals} both are. Most runs in a row {verdict}: "
                  f"**{in_a_row(mine, bound)}**."
                  + (f" `{MISS}`: the median over the run's wall runs of how far the pace meter read their pace "
                     "from the pace their own decode steps ran at (harness/report/steps_pace.py), and "
                     f"`{WORST}` the largest: a simulation priced at a pace its steps did not run at misses by that "
                     "much before the clock's prices count, and more near saturation, where the queue amplifies it."
                     if checked else "")
                  + "\n", md_table(pd.DataFrame(rows + [spread]))]
    return "\n".join(parts)


def _within(text: str) -> float:
    try:
        value = parse_fraction(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"--within must be a fraction in (0, 1] or a percentage (0.1 or 10%), "
                                         f"got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m harness.report.clock_runs", description=__doc__)
    parser.add_argument("runs", nargs="+", type=Path, help="one folder per validation run, in the order they ran")
    parser.add_argument("--within", type=_within, default=DEFAULT_WITHIN, metavar="F",
                        help=f"the bound a run's TPOT and E2EL medians are held to (default {DEFAULT_WITHIN:g} = "
                             f"{100 * DEFAULT_WITHIN:g}%%)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    missing = [str(d) for d in args.runs if not d.is_dir()]
    if missing:
        parser.error(f"not a folder: {', '.join(missing)}")
    got: list[RunMedians] = []
    for folder in args.runs:
        collection = collect([folder])
        for line in collection.warnings():
            print(f"kvbench clock-runs: warning: {line}", file=sys.stderr)
        got += run_medians(folder.name, collection.rows, collection.steps)
    if not got:
        print("kvbench clock-runs: no folder held a validated pair (a scenario=profile job's simulated rows beside "
              "wall rows of the same requests: make clock-runs makes them)", file=sys.stderr)
        return 1
    print(report(got, args.within))
    return 0


if __name__ == "__main__":
    sys.exit(quiet_when_closed(main))
