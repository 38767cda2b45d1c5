"""The simulated clock against the wall clock: rows of the same requests paired, errors computed, saturation marked."""

import pandas as pd
import pytest

from kvbench.harness.report.clock_validation import rate_pairs, service_pairs, summary
from kvbench.harness.report.clock_validation import clock_section

SETUP = {"status": "ok", "device_slug": "cpu-x-2core", "model": "tiny-llama", "dtype": "float32", "impl": "paged_cuda",
         "batch": 32, "max_seq_len": 512, "block_size": 16, "cpu_threads": 1, "workload": "chat",
         "num_requests": 64, "seed": 0, "slo": "normalized_latency_s<=0.01"}


def _service(scenario, clock, rate, tpot, achieved=None, digest=None, **more):
    return {**SETUP, "scenario": scenario, "clock": clock, "request_rate": rate, "workload_digest": digest or f"w{rate}",
            "achieved_rps": achieved if achieved is not None else rate, "run_dir": f"{scenario}/{rate}",
            **{f"{m}_ms_{p}": tpot * k for m, k in (("ttft", 4), ("tpot", 1), ("e2el", 60)) for p in ("p50", "p99")},
            **more}


def _rows():
    return pd.DataFrame([
        _service("decode", "wall", 10, 2.0), _service("profile", "simulated", 10, 2.2, clock_source="profile-a"),
        _service("decode", "wall", 20, 3.0), _service("profile", "simulated", 20, 2.7, clock_source="profile-a"),
        _service("decode", "wall", 45, 5.0, achieved=30), _service("profile", "simulated", 45, 9.0, clock_source="profile-a"),
        _service("decode", "wall", 30, 4.0, digest="other"),  # other requests: never paired
        {**SETUP, "scenario": "max_rate", "clock": "wall", "max_rate_rps": 40.0, "run_dir": "m/0"},
        {**SETUP, "scenario": "profile", "clock": "simulated", "max_rate_rps": 46.0, "clock_source": "profile-a",
         "run_dir": "p/0"},
    ])


def test_pairs_are_the_same_requests_on_both_clocks_with_their_errors():
    pairs = service_pairs(_rows())
    assert pairs["request_rate"].tolist() == [10, 20, 45]
    assert pairs["tpot_ms_p50_err"].round(3).tolist() == [0.1, -0.1, 0.8]
    assert pairs["saturated"].tolist() == [False, False, True]  # 30 of 45 req/s achieved
    rates = rate_pairs(_rows())
    assert rates["max_rate_err"].tolist() == pytest.approx([0.15])
    s = summary(pairs, rates)
    assert s["tpot_ms_p50"] == pytest.approx(0.1) and s["max_rate_rps"] == pytest.approx(0.15)  # saturated left out


def test_the_section_says_the_errors_and_nothing_without_pairs():
    text = "\n".join(clock_section(_rows()))
    assert "Median absolute error below saturation: median TPOT 10%" in text and "max rate within the SLO 15%" in text
    assert "| +80% |" in text and "profile-a" in text
    assert clock_section(_rows()[lambda d: d.scenario != "profile"]) == []


def test_a_profile_jobs_own_wall_run_is_preferred_to_another_processes():
    own = {**_service("profile", "wall", 10, 2.1), "run_dir": "profile/10"}
    rows = pd.concat([_rows(), pd.DataFrame([own])], ignore_index=True)
    rows.loc[rows.scenario == "profile", "run_dir"] = "profile/10"  # the simulated rows' job
    pairs = service_pairs(rows)
    ten = pairs[pairs.request_rate == 10]
    assert len(ten) == 1 and ten["same_process"].item() and ten["tpot_ms_p50_wall"].item() == pytest.approx(2.1)
    assert not pairs[pairs.request_rate == 20]["same_process"].item()  # no own wall run there: the decode sweep's
    text = "\n".join(clock_section(rows))
    header = next(line for line in text.splitlines() if "offered req/s" in line)
    assert "one process" in header


def test_the_drift_of_a_validating_job_is_said():
    rows = pd.concat([_rows(), pd.DataFrame([{**SETUP, "scenario": "profile", "clock_source": "profile-a",
                                              "profile_drift": 0.031, "run_dir": "p/0"}])], ignore_index=True)
    text = "\n".join(clock_section(rows))
    assert "cpu-x-2core paged_cuda +3%" in text


def test_each_wall_step_is_set_beside_its_price_on_its_own_jobs_profile():
    from kvbench.harness.report.clock_validation import step_prices

    def step(kind, price, wall, rate=10.0, chunked=False, run_dir="p/0"):
        return {"run_dir": run_dir, "impl": "paged_cuda", "kind": kind, "price_s": price, "duration_s": wall,
                "request_rate": rate, "chunked_prefill": chunked}

    steps = pd.DataFrame([
        step("decode", 0.002, 0.004), step("decode", 0.003, 0.003, rate=20.0), step("decode", 0.001, 0.004),
        step("prefill", 0.01, 0.01),
        step("mixed", None, 0.01, chunked=True),  # a mixed step's split is not recorded: not priced
        {**step("decode", None, 0.005, run_dir="d/0"), "request_rate": None},  # a decode sweep's: no price
    ])
    priced = step_prices(steps).set_index("kind")
    assert list(priced.index) == ["decode", "prefill"] and (priced["run_dir"] == "p/0").all()
    assert priced.loc["decode", "steps"] == 3 and priced.loc["decode", "rates"] == 2
    assert priced.loc["decode", "ratio_p50"] == pytest.approx(0.5)  # of 0.5, 1.0 and 0.25
    assert priced.loc["decode", "sum_ratio"] == pytest.approx(0.006 / 0.011)
    assert step_prices(steps.drop(columns="price_s")).empty
    text = "\n".join(clock_section(_rows(), steps))
    assert "| p/0 | paged_cuda | no | 2 | decode | 3 | 0.50 | 0.55 |" in text


def test_each_machine_gets_its_own_summary():
    other = _rows().assign(device_slug="cpu-y-2core")
    other[["tpot_ms_p50", "e2el_ms_p50", "ttft_ms_p50"]] *= [1.0, 1.0, 1.0]
    other.loc[other.clock == "simulated", "tpot_ms_p50"] *= 1.5
    text = "\n".join(clock_section(pd.concat([_rows(), other], ignore_index=True)))
    assert "below saturation on cpu-x-2core: median TPOT 10%" in text
    assert "below saturation on cpu-y-2core: median TPOT" in text and "on cpu-y-2core: median TPOT 10%" not in text


def test_a_profile_jobs_wall_search_is_compared_with_its_simulated_one_never_with_itself():
    rows = pd.DataFrame([
        {**SETUP, "scenario": "profile", "clock": "wall", "max_rate_rps": 7.5, "run_dir": "p/0"},
        {**SETUP, "scenario": "profile", "clock": "simulated", "max_rate_rps": 10.0, "clock_source": "profile-a",
         "run_dir": "p/0"},
    ])
    (pair,) = rate_pairs(rows).to_dict("records")
    assert (pair["max_rate_rps_wall"], pair["max_rate_rps_sim"]) == (7.5, 10.0) and pair["same_process"]
    assert pair["max_rate_err"] == pytest.approx(1 / 3)


def _validating(drift: float) -> pd.DataFrame:
    """_rows() with its simulated rows made one validating job's, which re-timed its profile at ``drift``."""
    rows = _rows()
    rows.loc[rows.scenario == "profile", "run_dir"] = "p/0"
    job = {**SETUP, "scenario": "profile", "clock_source": "profile-a", "profile_drift": drift, "run_dir": "p/0"}
    return pd.concat([rows, pd.DataFrame([job])], ignore_index=True)


def test_a_job_whose_machine_drifted_is_marked_and_left_out_of_the_medians():
    steady = service_pairs(_validating(0.05))
    assert steady["drift"].tolist() == pytest.approx([0.05] * 3) and not steady["drifted"].any()
    assert summary(steady, rate_pairs(_validating(0.05)))["tpot_ms_p50"] == pytest.approx(0.1)
    moved = _validating(-0.4)
    pairs, rates = service_pairs(moved), rate_pairs(moved)
    assert pairs["drifted"].all() and rates["drifted"].all()
    assert summary(pairs, rates) == {}  # nothing the machine did not move under
    text = "\n".join(clock_section(moved))
    assert "Median absolute error below saturation" not in text
    assert "Every pair came from a job whose machine drifted more than 15%" in text and "-40% (out)" in text
    # Another job's steady pairs keep their median; the drifted job's are counted out.
    other = _rows().assign(run_dir=lambda d: d.run_dir + "-steady", device_slug="cpu-x-2core")
    both = pd.concat([moved, other], ignore_index=True)
    text = "\n".join(clock_section(both))
    assert "median TPOT 10%" in text and "4 of 8 pairs came from a job whose machine drifted" in text


def test_a_rate_a_job_served_several_times_is_compared_by_the_median_of_its_wall_runs():
    """One job (scenario.rates=[10,20,10,10]): three wall runs at 10 req/s and their simulated rows, alike; the
    pair takes the wall runs' median of each figure and says how many and how far apart (TPOT p50: 2.0, 2.6, 3.0)."""
    runs = [_service("profile", "wall", 10, t, achieved=a, run_dir="p/0") for t, a in ((2.6, 9.0), (2.0, 10.0),
                                                                                        (3.0, 11.0))]
    sims = [_service("profile", "simulated", 10, 2.2, clock_source="profile-a", run_dir="p/0") for _ in range(3)]
    once = [_service("profile", "wall", 20, 3.0, run_dir="p/0"),
            _service("profile", "simulated", 20, 2.7, clock_source="profile-a", run_dir="p/0")]
    pairs = service_pairs(pd.DataFrame(runs + sims + once))
    assert pairs["request_rate"].tolist() == [10, 20]  # one pair a rate, whatever its repeats
    ten = pairs.iloc[0]
    assert ten["tpot_ms_p50_wall"] == pytest.approx(2.6) and ten["e2el_ms_p50_wall"] == pytest.approx(2.6 * 60)
    assert ten["achieved_rps"] == pytest.approx(10.0) and ten["wall_runs"] == 3
    assert ten["wall_spread"] == pytest.approx((3.0 - 2.0) / 2.6)
    assert ten["tpot_ms_p50_err"] == pytest.approx(2.2 / 2.6 - 1)
    assert pairs.iloc[1]["wall_runs"] == 1 and pairs.iloc[1]["wall_spread"] == 0
    text = "\n".join(clock_section(pd.DataFrame(runs + sims + once)))
    assert "compared by the median of its wall runs" in text and "| 3 | 38% |" in text
    # a table of one run a rate keeps its columns and says nothing of repeats
    plain = "\n".join(clock_section(_rows()))
    assert "| wall runs |" not in plain and "wall spread" not in plain


def _paced_job():
    """One validating job (p/0) with the pace meter: 10 req/s served twice (paces 1.1 and 1.3), 20 req/s once (0.9);
    each run simulated on the profile's own prices and at its pace; both searches of the max rate too."""
    def sim(rate, tpot, pace=None):
        return _service("profile", "simulated", rate, tpot, clock_source="profile-a", run_dir="p/0", machine_pace=pace)

    return pd.DataFrame([
        _service("profile", "wall", 10, 2.4, run_dir="p/0", machine_pace=1.1), sim(10, 2.0), sim(10, 2.2, 1.1),
        _service("profile", "wall", 10, 2.8, run_dir="p/0", machine_pace=1.3), sim(10, 2.0), sim(10, 2.6, 1.3),
        _service("profile", "wall", 20, 3.0, run_dir="p/0", machine_pace=0.9), sim(20, 3.3), sim(20, 2.97, 0.9),
        {**SETUP, "scenario": "profile", "clock": "wall", "max_rate_rps": 20.0, "run_dir": "p/0", "machine_pace": 1.25},
        {**SETUP, "scenario": "profile", "clock": "simulated", "max_rate_rps": 25.0, "clock_source": "profile-a",
         "run_dir": "p/0"},
        {**SETUP, "scenario": "profile", "clock": "simulated", "max_rate_rps": 21.0, "clock_source": "profile-a",
         "run_dir": "p/0", "machine_pace": 1.25},
    ])


def test_each_run_simulated_at_the_machines_pace_is_compared_beside_the_profiles_own_prices():
    rows = _paced_job()
    pairs = service_pairs(rows)
    assert pairs["request_rate"].tolist() == [10, 20]  # one pair a rate: the paced rows are not pairs of their own
    ten, twenty = pairs.iloc[0], pairs.iloc[1]
    assert ten["tpot_ms_p50_wall"] == pytest.approx(2.6) and ten["tpot_ms_p50_sim"] == pytest.approx(2.0)
    # the paced simulations of the rate's runs, by their median, as the wall runs are: 2.4 at a pace of 1.2
    assert ten["tpot_ms_p50_paced"] == pytest.approx(2.4) and ten["machine_pace"] == pytest.approx(1.2)
    assert ten["tpot_ms_p50_err"] == pytest.approx(2.0 / 2.6 - 1) and ten["tpot_ms_p50_paced_err"] == pytest.approx(2.4 / 2.6 - 1)
    assert twenty["tpot_ms_p50_paced_err"] == pytest.approx(-0.01)
    rates = rate_pairs(rows)
    assert rates["max_rate_err"].tolist() == pytest.approx([0.25]) and rates["max_rate_paced_err"].tolist() == pytest.approx([0.05])
    own, paced = summary(pairs, rates), summary(pairs, rates, paced=True)
    assert own["tpot_ms_p50"] == pytest.approx((0.6 / 2.6 + 0.1) / 2)
    assert paced["tpot_ms_p50"] == pytest.approx((0.2 / 2.6 + 0.01) / 2) and paced["max_rate_rps"] == pytest.approx(0.05)
    text = "\n".join(clock_section(rows))
    assert ("Median absolute error below saturation, each simulation priced at the machine's pace in its wall run: "
            "median TPOT 4%") in text and "At the profile's own pace: median TPOT 17%" in text
    header = next(line for line in text.splitlines() if "offered req/s" in line)
    assert "| pace |" in header and "| at pace |" in header and "| 1.20 |" in text and "`pace` is the machine's pace" in text
    assert "| error at pace |" in text and "| +5% |" in text


def test_without_a_pace_the_section_reads_as_before():
    text = "\n".join(clock_section(_rows()))
    assert "Median absolute error below saturation: median TPOT 10%" in text
    assert "at pace" not in text and "| pace |" not in text and "machine's pace" not in text
    paced = summary(service_pairs(_rows()), rate_pairs(_rows()), paced=True)
    assert paced == {}


def test_the_medians_at_pace_keep_a_drifted_jobs_pairs_those_at_the_profiles_own_pace_do_not():
    rows = _paced_job()
    rows = pd.concat([rows, pd.DataFrame([{**SETUP, "scenario": "profile", "clock_source": "profile-a",
                                            "profile_drift": 0.4, "run_dir": "p/0"}])], ignore_index=True)
    pairs, rates = service_pairs(rows), rate_pairs(rows)
    assert pairs["drifted"].all()
    assert summary(pairs, rates) == {}  # the machine moved under the profile: no median at its own prices
    paced = summary(pairs, rates, paced=True)  # the pace measured the machine in each run
    assert paced["tpot_ms_p50"] == pytest.approx((0.2 / 2.6 + 0.01) / 2)
    text = "\n".join(clock_section(rows))
    assert "each simulation priced at the machine's pace in its wall run: median TPOT 4%" in text
    assert "out of the medians at the profile's own pace; the medians at the machine's pace keep them" in text


def test_with_the_jobs_steps_each_paced_pair_shows_the_pace_its_own_steps_ran_at():
    rows = _paced_job()
    wall_dir = service_pairs(rows)["run_dir_wall"].iloc[0]
    steps = pd.DataFrame([{"run_dir": wall_dir, "impl": "paged_cuda", "request_rate": 10.0, "chunked_prefill": False,
                           "kind": "decode", "place": 0, "start_s": start, "duration_s": 0.003, "price_s": 0.002}
                          for start in (0.0, 0.5)])
    text = "\n".join(clock_section(rows, steps))
    header = next(line for line in text.splitlines() if "offered req/s" in line)
    assert "| pace | steps' pace |" in header and "| 1.20 | 1.50 |" in text
    assert "The meter read the pace of its runs a median 20% off (from -20% to -20%, 1 wall run)" in text
    assert "steps' pace" not in "\n".join(clock_section(rows))  # no steps tables: no column

