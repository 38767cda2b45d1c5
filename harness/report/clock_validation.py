"""The simulated clock against the wall clock: the same requests, served for real and simulated on a profile.

A ``scenario=profile`` job simulates its workload at each of its rates on the step profile it
measured (``clock=simulated``); a wall-clock decode job of the same config at the same rate
served the very requests (the same ``workload_digest``). Per pair, each latency figure's
error is simulated / wall - 1. A pair is below saturation when the wall run achieved at least
``SATURATED`` of its offered rate: past that, a queue grows and every figure depends on how long
the run lasted, not on the clock. The max rate within the SLO is compared the same way, between
the profile job's search and the ``scenario=max_rate`` wall-clock row of the same settings.
"""

from __future__ import annotations

import pandas as pd

from kvbench.harness.measure.pace_meter import SETTLED
from kvbench.harness.report.selection import measured_as, ok_rows
from kvbench.harness.report.steps_pace import miss_said, with_steps_pace
from kvbench.harness.report.tables import md_table, md_text, pick

CLOCK_TITLE = "The simulated clock against the wall clock"
SATURATED = 0.9  # achieved over offered rate below which a run is saturated
# A validating job whose machine moved more than this while it ran (``profile_drift``: its profile's last pass,
# or a re-timing at the end, against the first) compares two machines, not two clocks: its pairs stay in the
# table, marked, and leave the medians. On the shared 2-core machines one process's drift ran from 1% to 68%.
MAX_DRIFT = 0.15
PACE_SAID = ("`pace` is the machine's pace in the wall run against its pace while the job measured its profile: "
             "the median time of one fixed unit of the model's own dense work (its layers' MLPs and the logits, "
             "no cache), timed in the serving thread between the profile's points and at most every quarter second "
             f"of the wall run, once the engine has run {SETTLED} steps since it last slept "
             "(harness/measure/pace_meter.py; 1.20: the same work took 1.2x as long). On the shared 2-core "
             "machines the host slows a thread by up to 1.9x for seconds to tens of seconds, unseen from inside: "
             "`at pace` is the error of the same simulation with every price scaled by the run's pace, the clock's "
             "error with the machine's speed in the run measured rather than assumed.\n")
STEPS_PACE_SAID = ("`steps' pace` is the pace the wall run's own decode steps ran at: their summed time over their "
                   "summed price on the job's profile, known only once the run is over "
                   "(harness/report/steps_pace.py). The meter read the pace of its runs {miss}: where it missed, "
                   "the simulation at pace was priced at a pace the steps did not run at, and the queue near "
                   "saturation amplifies that miss in E2EL and TTFT.\n")
FIGURES = [f"{m}_ms_{p}" for m in ("ttft", "tpot", "e2el") for p in ("p50", "p99")]
# What makes two rows the same requests on the same setup (the digest covers prompts and arrival times).
PAIR = ["device_slug", "model", "dtype", "impl", "batch", "chunked_prefill", "max_num_batched_tokens", "max_seq_len",
        "block_size", "cpu_threads", "workload_digest"]
RATE_PAIR = ["device_slug", "model", "dtype", "impl", "batch", "chunked_prefill", "max_num_batched_tokens",
             "max_seq_len", "block_size", "cpu_threads", "workload", "num_requests", "seed", "slo"]


def _keys(df: pd.DataFrame, keys: list[str]) -> list[str]:
    return [k for k in keys if k in df]


def service_pairs(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (setting, rate) served on both clocks: each figure on each, and its error."""
    wall = measured_as(rows, "decode")
    sim = ok_rows(rows, "profile")
    need = {"clock", "request_rate", *FIGURES}
    if wall.empty or sim.empty or not need <= set(wall) or not need <= set(sim):
        return pd.DataFrame()
    wall = wall[(wall["clock"] == "wall") & wall["request_rate"].notna()]
    sim, at_pace = _paced_apart(sim[(sim["clock"] == "simulated") & sim["request_rate"].notna()])
    keys = _keys(wall, PAIR)
    keys = [k for k in keys if k in sim] + ["request_rate"]
    cols = [c for c in (*FIGURES, "achieved_rps", "preemptions", "run_dir") if c in wall]
    where = ["run_dir"] if "run_dir" in sim else []
    sim = sim.drop_duplicates([*keys, *where])  # a rate served twice is simulated twice, alike
    both = _median_of_repeats(wall[keys + cols], keys).merge(
        sim[keys + [c for c in (*FIGURES, "clock_source", "run_dir") if c in sim]], on=keys, suffixes=("_wall", "_sim"))
    if both.empty:
        return both
    both = _with_pace(_with_drift(_one_wall_run(both, keys), rows), at_pace, keys, FIGURES)
    for f in FIGURES:
        both[f"{f}_err"] = both[f"{f}_sim"] / both[f"{f}_wall"] - 1
        both[f"{f}_paced_err"] = both[f"{f}_paced"] / both[f"{f}_wall"] - 1
    both["saturated"] = both["achieved_rps"] < SATURATED * both["request_rate"]
    order = [k for k in ("device_slug", "model", "impl", "chunked_prefill", "request_rate") if k in both]
    return both.sort_values(order).reset_index(drop=True)


def _paced_apart(sim: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the simulated rows priced at the profile's own prices, those priced at the machine's pace in their wall run:
    ``machine_pace``, harness/measure/pace_meter.py); rows from before the meter are all of the first kind."""
    if "machine_pace" not in sim:
        return sim, sim.iloc[0:0]
    paced = sim["machine_pace"].notna()
    return sim[~paced], sim[paced]


def _with_pace(both: pd.DataFrame, at_pace: pd.DataFrame, keys: list[str], figures: list[str]) -> pd.DataFrame:
    """``both`` with each of ``figures`` as its job simulated it at the machine's pace in the wall run (``<f>_paced``;
    the median where the job served the rate more than once, each run at its own pace) and that pace
    (``machine_pace``, the median likewise); NaN where the job measured no pace."""
    cols = [f for f in figures if f in at_pace]
    if at_pace.empty or "run_dir" not in at_pace or "run_dir_sim" not in both:
        return both.assign(machine_pace=float("nan"), **{f"{f}_paced": float("nan") for f in figures})
    paced = (at_pace.groupby([*keys, "run_dir"], dropna=False, sort=False)[[*cols, "machine_pace"]].median()
             .reset_index().rename(columns={"run_dir": "run_dir_sim", **{f: f"{f}_paced" for f in cols}}))
    return both.merge(paced, on=[*keys, "run_dir_sim"], how="left")


def _median_of_repeats(wall: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """One wall row per setting, rate and run folder: where a job served the same requests at the same rate more
    than once (``scenario.rates=[5,10,5,10]``), each figure is the median of its runs, ``wall_runs`` counts them
    and ``wall_spread`` is their TPOT p50's (max - min) / median: the wall clock's own reproducibility, which no
    simulated figure can beat. On the 2-core AMD machine four runs of the same 64 requests in one process, minutes
    apart, gave TPOT p50 2.78-3.82 ms (contiguous, 5 req/s) and 2.34-3.77 ms (paged_cuda): one wall run is
    that noisy a reference, the median of several less so."""
    by = [*keys, *(["run_dir"] if "run_dir" in wall else [])]
    numeric = [c for c in wall if c not in by]
    grouped = wall.groupby(by, dropna=False, sort=False)
    out = grouped[numeric].median().reset_index()
    out["wall_runs"] = grouped.size().to_numpy()
    tpot = grouped["tpot_ms_p50"]
    out["wall_spread"] = ((tpot.max() - tpot.min()) / tpot.median()).to_numpy()
    return out


def _one_wall_run(both: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """One wall run per simulated row: the one its own job served in its process when there is one
    (scenario.wall: the same machine state), else the first other (a separate sweep's)."""
    if not {"run_dir_wall", "run_dir_sim"} <= set(both):  # rows not read from run folders: nothing to prefer
        return both.assign(same_process=False)
    both = both.assign(same_process=both["run_dir_wall"] == both["run_dir_sim"])
    return (both.sort_values("same_process", ascending=False, kind="stable")
            .drop_duplicates([*keys, "run_dir_sim"]).reset_index(drop=True))


def _with_drift(both: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """Each pair's ``drift``: its simulated row's job's ``profile_drift`` (NaN where the job ran no wall check),
    and ``drifted``: beyond MAX_DRIFT either way."""
    drift = pd.Series(float("nan"), index=both.index)
    if "profile_drift" in rows and "run_dir_sim" in both:
        jobs = ok_rows(rows, "profile").dropna(subset=["profile_drift"])
        drift = both["run_dir_sim"].map(jobs.drop_duplicates("run_dir").set_index("run_dir")["profile_drift"])
    return both.assign(drift=drift.astype(float), drifted=drift.abs() > MAX_DRIFT)


def rate_pairs(rows: pd.DataFrame) -> pd.DataFrame:
    """The max rate within the SLO on each clock, per setting."""
    wall, sim = measured_as(rows, "max_rate"), ok_rows(rows, "profile")
    if wall.empty or sim.empty or "max_rate_rps" not in sim or "clock" not in wall:
        return pd.DataFrame()
    wall = wall[(wall["clock"] == "wall") & wall["max_rate_rps"].notna()]
    sim, at_pace = _paced_apart(sim[(sim["clock"] == "simulated") & sim["max_rate_rps"].notna()])  # not the wall search
    keys = [k for k in _keys(wall, RATE_PAIR) if k in sim]
    where = ["run_dir"] if "run_dir" in wall and "run_dir" in sim else []
    both = wall[keys + ["max_rate_rps", *where]].merge(sim[keys + ["max_rate_rps", "clock_source", *where]],
                                                       on=keys, suffixes=("_wall", "_sim"))
    if both.empty:
        return both
    both = _with_pace(_with_drift(_one_wall_run(both, keys), rows), at_pace, keys, ["max_rate_rps"])
    both["max_rate_err"] = both["max_rate_rps_sim"] / both["max_rate_rps_wall"] - 1
    both["max_rate_paced_err"] = both["max_rate_rps_paced"] / both["max_rate_rps_wall"] - 1
    return both.sort_values(["device_slug", "model", "impl"]).reset_index(drop=True)


def summary(pairs: pd.DataFrame, rates: pd.DataFrame, paced: bool = False) -> dict[str, float]:
    """Median absolute errors below saturation (TPOT and E2EL p50, the issue's goals) and of the max rate,
    over the pairs whose job's machine did not drift past MAX_DRIFT; with ``paced``, the errors of the simulations
    priced at the machine's pace in their wall runs, over every pair that has one: the pace measures the machine in
    each run, which is what the drift stands in for (over eleven validation runs on the AMD 2-core machine, keeping
    the drifted jobs' paced pairs left each run's median as it was or nearer, but for one E2EL, and gave one to the
    run whose jobs had all drifted)."""
    out: dict[str, float] = {}
    if not pairs.empty and "drifted" in pairs and not paced:
        pairs = pairs[~pairs["drifted"]]
    if not rates.empty and "drifted" in rates and not paced:
        rates = rates[~rates["drifted"]]
    below = pairs[~pairs["saturated"]] if not pairs.empty else pairs
    tail = "_paced_err" if paced else "_err"
    for f in ("tpot_ms_p50", "e2el_ms_p50", "ttft_ms_p50"):
        errors = below[f"{f}{tail}"].dropna() if f"{f}{tail}" in below else pd.Series(dtype=float)
        if not errors.empty:
            out[f] = float(errors.abs().median())
    name = "max_rate_paced_err" if paced else "max_rate_err"
    if not rates.empty and name in rates and rates[name].notna().any():
        out["max_rate_rps"] = float(rates[name].dropna().abs().median())
    return out


def _pct(v) -> str:
    return "–" if v is None or pd.isna(v) else f"{100 * v:+.0f}%"


def _drift_said(frame: pd.DataFrame) -> pd.Series:
    """The table's drift column: the job's drift, ``(out)`` when it left the medians."""
    return frame["drift"].map(_pct) + frame["drifted"].map({True: " (out)", False: ""})


def _drifted_line(pairs: pd.DataFrame, rates: pd.DataFrame, on: str, paced: bool = False) -> list[str]:
    """What the medians left out because the machine moved under the job (MAX_DRIFT)."""
    out = [f for f in (pairs, rates) if not f.empty and "drifted" in f]
    left = sum(int(f["drifted"].sum()) for f in out)
    if not left:
        return []
    total = sum(len(f) for f in out)
    head = (f"Every pair{on}" if left == total else f"{left} of {total} pairs{on}") + \
        f" came from a job whose machine drifted more than {100 * MAX_DRIFT:.0f}% while it ran"
    tail = (": no error in the table below can be told from the machine's own, and no median is given." if left == total else
            ": they are in the table below (its `drift` column) and out of the median above.")
    if paced:
        tail = (": they are in the table below (its `drift` column) and out of the medians at the profile's own pace; "
                "the medians at the machine's pace keep them (the pace measures the machine in each run).")
    return [head + tail + "\n"]


def _drift_lines(rows: pd.DataFrame) -> list[str]:
    """How far each validating profile job's machine moved while its wall runs ran (``profile_drift``)."""
    if "profile_drift" not in rows:
        return []
    jobs = ok_rows(rows, "profile").dropna(subset=["profile_drift"])
    if jobs.empty:
        return []
    said = ", ".join(f"{md_text(r.device_slug)} {md_text(r.impl)} {_pct(r.profile_drift)}" for r in
                     jobs.sort_values(["device_slug", "impl"]).itertuples())
    return ["Rows marked one process were served on the wall clock by the profile's own job, right after it "
            "measured the profile (`scenario.wall=true`): a profile and wall runs from two processes compare two "
            "states of the machine (on the 2-core CPU machines the same profile differs by 5-15% from one fresh "
            "process to the next). Each such job measures its profile's grid in passes spread over its wall runs, "
            "so that the profile samples the machine over the minutes they do; the drift (the last pass against "
            "the first, or a one-pass profile re-timed at the job's end against its first timing: later / first, "
            f"less 1, median over the points) was: {said}.\n"]


def step_prices(steps: pd.DataFrame) -> pd.DataFrame:
    """Per validating job, impl, scheduling and step kind (over its rates): its wall runs' steps as the
    profile the same job measured priced them (``price_s``, written by the job), against each step's wall
    time. This is the clock's own error, apart from the queue's: a different schedule moves latencies,
    not this."""
    need = {"run_dir", "impl", "kind", "price_s", "duration_s", "request_rate"}
    if steps.empty or not need <= set(steps):
        return pd.DataFrame()
    mine = steps[steps["price_s"].notna() & (steps["duration_s"] > 0)]
    chunked = mine["chunked_prefill"].fillna(False).astype(bool) if "chunked_prefill" in mine else False
    out = []
    for (run_dir, impl, chunk, kind), g in mine.assign(chunked=chunked).groupby(["run_dir", "impl", "chunked", "kind"]):
        out.append({"run_dir": run_dir, "impl": impl, "chunked": chunk, "kind": kind, "rates": g["request_rate"].nunique(),
                    "steps": len(g), "ratio_p50": (g["price_s"] / g["duration_s"]).median(),
                    "sum_ratio": g["price_s"].sum() / g["duration_s"].sum()})
    return pd.DataFrame(out)


def _step_lines(steps: pd.DataFrame) -> list[str]:
    priced = step_prices(steps)
    if priced.empty:
        return []
    t = priced.assign(chunked=priced["chunked"].map({True: "yes", False: "no"}),
                      ratio_p50=priced["ratio_p50"].map(lambda v: f"{v:.2f}"),
                      sum_ratio=priced["sum_ratio"].map(lambda v: f"{v:.2f}"))
    return ["Each step of those wall runs priced by its job's profile, against its wall time (the clock's own "
            "error, apart from the queue's): price / wall, the median step and the sum of the steps. A step's "
            "price is its shape's times the factor of its place since the engine last slept, or since the busy "
            "prefill it follows (a whole prompt's, run between decode steps), which the profile's after-idle probe "
            "measured (a profile made before the probe: its shape's alone).\n",
            md_table(pick(t, {"run_dir": "run", "impl": "impl", "chunked": "chunked prefill",
                              "rates": "rates", "kind": "step", "steps": "steps",
                              "ratio_p50": "median price / wall", "sum_ratio": "sum price / sum wall"}))]


def _medians(said: dict[str, str], own: dict[str, float], paced: dict[str, float]) -> str:
    """The medians' sentence after its subject: at the machine's pace first where the jobs measured it, then at the
    profile's own prices; empty without either."""
    def listed(s: dict[str, float]) -> str:
        return ", ".join(f"{said[k]} {100 * v:.0f}%" for k, v in s.items())

    if paced:
        tail = f". At the profile's own pace: {listed(own)}." if own else "."
        return f", each simulation priced at the machine's pace in its wall run: {listed(paced)}{tail}"
    return f": {listed(own)}." if own else ""


def clock_section(rows: pd.DataFrame, steps: pd.DataFrame | None = None) -> list[str]:
    """Each rate served on both clocks (harness/report/clock_validation.py), and the max rates; with the
    validating jobs' steps tables, each wall step against its price on the job's profile."""
    pairs, rates = service_pairs(rows), rate_pairs(rows)
    if pairs.empty and rates.empty:
        return []
    parts = [f"## {CLOCK_TITLE}\n",
             "The same requests served on the wall clock (`scenario=decode`, `scenario=max_rate`, or the profile "
             "job's own wall runs with `scenario.wall=true`) and simulated "
             "on a profile of this machine's own steps (`scenario=profile`, whose `clock_source` names the "
             "profile): error = simulated / wall - 1. A rate whose wall run achieved under 90% of it is "
             "saturated: its queue, not the clock, sets its latencies.\n"]
    said = {"tpot_ms_p50": "median TPOT", "e2el_ms_p50": "median E2EL", "ttft_ms_p50": "median TTFT",
            "max_rate_rps": "max rate within the SLO"}
    chunked = (pairs["chunked_prefill"].fillna(False).astype(bool) if "chunked_prefill" in pairs
               else pd.Series(False, index=pairs.index))
    # One machine's errors at a time: two machines' rows (one of them maybe from older code) are two validations.
    devices = sorted({*pairs.get("device_slug", pd.Series(dtype=str)).dropna(),
                      *rates.get("device_slug", pd.Series(dtype=str)).dropna()})
    for device in devices or [None]:
        mine = pairs["device_slug"] == device if device is not None else pd.Series(True, index=pairs.index)
        on = f" on {md_text(device)}" if device is not None and len(devices) > 1 else ""
        its_rates = rates[rates["device_slug"] == device] if device is not None and not rates.empty else rates
        both = _medians(said, summary(pairs[~chunked & mine], its_rates), summary(pairs[~chunked & mine], its_rates, True))
        if both:
            parts.append(f"Median absolute error below saturation{on}{both}\n")
        parts += _drifted_line(pairs[mine], its_rates, on, bool(pairs[mine].get("machine_pace", pd.Series(dtype=float)).notna().any()))
        both = _medians(said, summary(pairs[chunked & mine], pd.DataFrame()),
                        summary(pairs[chunked & mine], pd.DataFrame(), True))
        if both:
            parts.append(f"With chunked prefill{on} (mixed steps priced as the decode step plus what the chunk adds "
                         f"along the prefill line and the prefill attention path){both}\n")
    if not pairs.empty:
        pairs = with_steps_pace(pairs.assign(chunked=chunked.map({True: "yes", False: "no"})), steps)
        paced = bool(pairs["machine_pace"].notna().any())
        checked = paced and bool(pairs["steps_pace"].notna().any())
        t = pairs.assign(**{f"{f} err": pairs[f"{f}_err"].map(_pct) for f in
                            ("ttft_ms_p50", "tpot_ms_p50", "e2el_ms_p50", "ttft_ms_p99", "tpot_ms_p99", "e2el_ms_p99")},
                         **{f"{f} paced": pairs[f"{f}_paced_err"].map(_pct) for f in ("ttft_ms_p50", "tpot_ms_p50", "e2el_ms_p50")},
                         pace=pairs["machine_pace"].map(lambda v: "–" if pd.isna(v) else f"{v:.2f}"),
                         steps_pace=pairs["steps_pace"].map(lambda v: "–" if pd.isna(v) else f"{v:.2f}"),
                         saturated=pairs["saturated"].map({True: "yes", False: "no"}),
                         one_process=pairs["same_process"].map({True: "yes", False: "no"}),
                         drift_said=_drift_said(pairs))
        repeated = "wall_runs" in t and bool((t["wall_runs"] > 1).any())
        if repeated:  # a rate served several times in one job: the median of its runs, and how far they spread
            t = t.assign(wall_spread=t["wall_spread"].map(lambda v: "–" if pd.isna(v) else f"{100 * v:.0f}%"))
            parts.append("A rate a job served more than once is compared by the median of its wall runs (`wall "
                         "runs`); `wall spread` is their TPOT p50's (max - min) / median: the wall clock's own "
                         "reproducibility, which bounds how near any simulated figure can come.\n")
        if paced:
            parts.append(PACE_SAID)
        if checked:
            parts.append(STEPS_PACE_SAID.format(miss=miss_said(pairs)))
        parts.append(md_table(pick(t, {
            "device_slug": "device", "model": "model", "impl": "impl", "chunked": "chunked prefill",
            "request_rate": "offered req/s",
            "achieved_rps": "achieved req/s", "saturated": "saturated", "one_process": "one process",
            "drift_said": "drift",
            **({"wall_runs": "wall runs", "wall_spread": "wall spread"} if repeated else {}),
            **({"pace": "pace"} if paced else {}), **({"steps_pace": "steps' pace"} if checked else {}),
            "tpot_ms_p50_wall": "TPOT p50 ms wall", "tpot_ms_p50_sim": "simulated", "tpot_ms_p50 err": "error",
            **({"tpot_ms_p50 paced": "at pace"} if paced else {}),
            "e2el_ms_p50_wall": "E2EL p50 ms wall", "e2el_ms_p50_sim": "simulated", "e2el_ms_p50 err": "error ",
            **({"e2el_ms_p50 paced": "at pace "} if paced else {}),
            "ttft_ms_p50_wall": "TTFT p50 ms wall", "ttft_ms_p50_sim": "simulated", "ttft_ms_p50 err": "error  ",
            **({"ttft_ms_p50 paced": "at pace  "} if paced else {}),
            "tpot_ms_p99 err": "TPOT p99 error", "e2el_ms_p99 err": "E2EL p99 error", "ttft_ms_p99 err": "TTFT p99 error",
        })))
    parts += _drift_lines(rows)
    if steps is not None:
        parts += _step_lines(steps)
    if not rates.empty:
        paced = bool(rates["machine_pace"].notna().any())
        t = rates.assign(error=rates["max_rate_err"].map(_pct), paced_error=rates["max_rate_paced_err"].map(_pct),
                         pace=rates["machine_pace"].map(lambda v: "–" if pd.isna(v) else f"{v:.2f}"),
                         drift_said=_drift_said(rates))
        parts += ["Max rate within the SLO on each clock" + (" (at pace: the simulated search priced at the "
                  "machine's pace over the wall search's runs)" if paced else "") + ":\n",
                  md_table(pick(t, {"device_slug": "device", "model": "model", "impl": "impl", "slo": "SLO",
                                     "max_rate_rps_wall": "wall req/s", "max_rate_rps_sim": "simulated req/s",
                                     "error": "error",
                                     **({"pace": "pace", "max_rate_rps_paced": "at pace req/s",
                                         "paced_error": "error at pace"} if paced else {}),
                                     "drift_said": "drift", "clock_source": "profile"}))]
    return parts
