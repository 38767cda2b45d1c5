"""The clock's validation over several runs: each run's medians, their median and range, and the runs in a row."""

from pathlib import Path

import pandas as pd
import pytest

from kvbench.harness.report.clock_runs import RunMedians, in_a_row, main, report, run_medians

SETUP = {"status": "ok", "device_slug": "cpu-x-2core", "model": "tiny-llama", "dtype": "float32", "impl": "paged_cuda",
         "batch": 32, "max_seq_len": 512, "block_size": 16, "cpu_threads": 1, "workload": "chat",
         "num_requests": 64, "seed": 0, "slo": "normalized_latency_s<=0.01"}


def _job(tpot_err: float, paced_err: float, run_dir: str = "p/0", device: str = "cpu-x-2core",
         chunked_err: float = 0.5) -> list[dict]:
    """One validating job: 10 req/s on the wall clock (TPOT 2 ms) and simulated on its profile with ``tpot_err`` and
    at the machine's pace with ``paced_err`` (E2EL and TTFT alike); 10 req/s with chunked prefill ``chunked_err``
    off (never in the medians)."""
    def row(clock, tpot, chunked=False, **more):
        return {**SETUP, "device_slug": device, "scenario": "profile", "clock": clock, "request_rate": 10.0,
                "workload_digest": "w10", "achieved_rps": 10.0, "run_dir": run_dir, "chunked_prefill": chunked,
                **{f"{m}_ms_{p}": tpot * k for m, k in (("ttft", 4), ("tpot", 1), ("e2el", 60)) for p in ("p50", "p99")},
                **more}

    return [row("wall", 2.0, machine_pace=1.1), row("simulated", 2.0 * (1 + tpot_err), clock_source="profile-a"),
            row("simulated", 2.0 * (1 + paced_err), clock_source="profile-a", machine_pace=1.1),
            row("wall", 2.0, True, machine_pace=1.0), row("simulated", 2.0 * (1 + chunked_err), True, clock_source="profile-a"),
            row("simulated", 2.0 * (1 + chunked_err), True, clock_source="profile-a", machine_pace=1.0)]


def test_a_runs_medians_are_the_reports_at_pace_and_at_the_profiles_own_prices_chunked_prefill_apart():
    (got,) = run_medians("r1", pd.DataFrame(_job(0.2, -0.05)))
    assert got.device == "cpu-x-2core"
    assert got.own["tpot_ms_p50"] == pytest.approx(0.2) and got.paced["tpot_ms_p50"] == pytest.approx(0.05)
    assert got.paced["e2el_ms_p50"] == pytest.approx(0.05)  # the chunked pair (50% off) is in neither
    assert got.headline is got.paced and got.within(0.1) and not got.within(0.04)


def test_each_machine_is_its_own_validation():
    rows = pd.DataFrame(_job(0.2, 0.05) + _job(0.3, 0.3, run_dir="q/0", device="cpu-y-2core"))
    got = run_medians("r1", rows)
    assert [g.device for g in got] == ["cpu-x-2core", "cpu-y-2core"]
    assert [g.within(0.1) for g in got] == [True, False]


def test_runs_in_a_row_count_only_consecutive_runs_within_the_bound():
    def run(e):
        return RunMedians("r", "d", {"tpot_ms_p50": e, "e2el_ms_p50": 0.05}, {})

    assert in_a_row([run(e) for e in (0.05, 0.12, 0.05, 0.09, 0.1, 0.2)], 0.1) == 3
    assert in_a_row([run(0.2)], 0.1) == 0
    # a run that measured no E2EL is not within the bound
    assert in_a_row([RunMedians("r", "d", {"tpot_ms_p50": 0.01}, {})], 0.1) == 0
    # without a pace, the profile's own medians are the run's
    assert in_a_row([RunMedians("r", "d", {}, {"tpot_ms_p50": 0.02, "e2el_ms_p50": 0.03})], 0.1) == 1


def test_the_table_gives_each_run_then_the_median_and_range_and_escapes_folder_names():
    runs = [RunMedians(name, "cpu-x-2core", {"tpot_ms_p50": t, "e2el_ms_p50": 0.04}, {"tpot_ms_p50": 2 * t})
            for name, t in (("<b>1</b>", 0.05), ("2", 0.15), ("3", 0.07))]
    text = report(runs, 0.1)
    assert "### cpu-x-2core" in text and "Most runs in a row within 10%: **1**" in text
    assert "| <b>" not in text and "&lt;b>1&lt;/b>" in text
    assert "| median of 3 (range) | 7% (5%-15%) | 14% (10%-30%) | 4% (4%-4%) | – |" in text
    assert "| 2 of 3 |" in text


def test_the_command_reads_each_run_folder_and_says_one_line_without_pairs(tmp_path: Path, capsys):
    for n, (own, paced) in enumerate([(0.2, 0.05), (0.1, 0.08), (0.3, 0.02)], 1):
        folder = tmp_path / f"run{n}" / "clock" / "0"
        folder.mkdir(parents=True)
        pd.DataFrame(_job(own, paced)).to_csv(folder / "rows.csv", index=False)
    assert main([str(tmp_path / f"run{n}") for n in (1, 2, 3)]) == 0
    out = capsys.readouterr().out
    assert "Most runs in a row within 10%: **3**" in out and "| run2 | 8% | 10% |" in out
    assert main([str(tmp_path / "run1"), "--within", "4%"]) == 0
    assert "within 4%: **0**" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty")]) == 1
    assert "no folder held a validated pair" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "nowhere")])
    assert e.value.code == 2
    with pytest.raises(SystemExit):
        main([str(tmp_path / "run1"), "--within", "0"])
    assert "--within must be a fraction in (0, 1]" in capsys.readouterr().err


def test_with_its_steps_a_run_says_how_far_its_meter_missed_its_wall_runs_own_steps():
    rows = pd.DataFrame(_job(0.2, 0.05))
    steps = pd.DataFrame([{"run_dir": "p/0", "impl": "paged_cuda", "request_rate": 10.0, "chunked_prefill": chunked,
                           "kind": "decode", "place": 0, "start_s": start, "duration_s": 0.002, "price_s": 0.002 / pace}
                          for chunked, pace in ((False, 1.0), (True, 1.25)) for start in (0.0, 0.5)])
    (got,) = run_medians("r1", rows, steps)
    # the meter read 1.1 where the whole prompts' steps ran at 1.0 (+10%), and 1.0 for the chunked ones' 1.25 (-20%)
    assert got.meter_miss == pytest.approx(0.15) and got.meter_worst == pytest.approx(0.2)
    text = report([got], 0.1)
    assert "| meter miss | worst miss |" in text and "| 15% | 20% | yes |" in text and "`worst miss` the largest" in text
    (without,) = run_medians("r1", rows)
    assert without.meter_miss is None and "meter miss" not in report([without], 0.1)

