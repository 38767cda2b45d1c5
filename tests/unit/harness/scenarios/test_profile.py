"""scenario=profile: the model's own steps measured into a table, and the simulated clock priced from it."""

from __future__ import annotations

import pandas as pd
import pytest

from kvbench.harness.errors import ConfigError
from kvbench.harness.front.job import run_job

SMALL = ["model=tiny-llama", "device=cpu", "max_seq_len=64", "batch=4", "cpu_threads=1",
         "workload=uniform", "workload.num_requests=8", "workload.prompt_len=12", "workload.output_len=6",
         "device.kv_cache_gb=0.001"]
PROFILE = ["scenario=profile", "scenario.batches=[1,3]", "scenario.contexts=[8,40]", "scenario.decode_steps=3",
           "scenario.settle_steps=2",
           "scenario.prefill_tokens=[16,100]", "arrival=poisson", "arrival.rate=40", "scenario.rates=[20,40]",
           "scenario.chunked_rates=[20]", "scenario.chunked_budget=8"]


def _profile_job(tmp_path_factory, name: str, *extra: str):
    """One profile job of paged_torch on SMALL with PROFILE and ``extra``: its folder and rows (module-scoped
    fixtures compose with Hydra themselves, as the ``compose`` fixture is function-scoped)."""
    from hydra import compose, initialize_config_dir

    from kvbench.harness.front.schemas import register_configs
    from kvbench.harness.paths import CONF_DIR

    register_configs()
    with initialize_config_dir(str(CONF_DIR), version_base=None):
        cfg = compose("config", ["progress=false", "+impl=paged_torch", *SMALL, *PROFILE, *extra])
    out = tmp_path_factory.mktemp(name)
    rows, code = run_job(cfg, out)
    assert code == 0, [r.get("error") for r in rows]
    return out, rows


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    return _profile_job(tmp_path_factory, "profile")


def test_the_profile_table_holds_each_grid_point_measured(profiled):
    out, rows = profiled
    table = pd.read_parquet(out / "profile.parquet")
    table = table[~table.kind.isin(["after_idle", "after_busy"])]  # the after-idle probe's rows: the test below
    decode, prefill = table[table.kind == "decode"], table[table.kind == "prefill"]
    # the mean context the timed steps read: c + 1 (the prefill's token) + 2 (the settling steps) + 1 (the timed
    # steps' middle)
    assert sorted(zip(decode.batch, decode.context)) == [(1, 12.0), (1, 44.0), (3, 12.0), (3, 44.0)]
    assert sorted(prefill.tokens) == [16, 100]
    assert (table.seconds > 0).all() and (table.seconds_p10 <= table.seconds).all()
    # each point pools its samples from the 3 passes over the grid: 3 decode steps, 3 prefill forwards a pass
    assert (table.seconds <= table.seconds_p90).all() and (table.samples == 9).all()
    summary = rows[0]
    assert summary["scenario"] == "profile" and summary["clock_source"].startswith("profile-")
    # the grid's 6 points, the after-idle curve's 5 places and the busy one's 5
    assert summary["probes"] == 6 + 5 + 5 and "cpu_util" in summary  # the CPU it got while it measured
    # attention (the cache's writes and kernel) is timed apart from the dense work, inside each step
    assert (table.attention_seconds > 0).all() and (table.attention_seconds < table.seconds_p90).all()
    assert ((table.attention_share > 0) & (table.attention_share < 1)).all()
    assert 0 < summary["attention_share_decode"] < 1 and 0 < summary["attention_share_prefill"] < 1
    top = decode.sort_values(["batch", "context"]).iloc[-1]
    assert summary["attention_share_decode_top"] == top.attention_share


def test_the_probe_prices_the_steps_after_a_sleep_and_the_simulated_clock_reads_its_factors(profiled):
    """Each pass ends with the after-idle probe (harness/scenarios/after_idle_probe.py): three sleeps, each then a
    12-token prompt for 32 decode steps (max_seq_len 64 leaves them), so every bin has samples: the prefill's 9,
    one place each of the early bins, the reference the other 29 places; then a second prompt's busy prefill and 8
    steps of both: the busy curve's prefill, bins and a reference of 5 places."""
    from kvbench.harness.serving.after_idle import DECODE_BINS, MAX_FACTOR, MIN_FACTOR, REFERENCE_FROM
    from kvbench.harness.serving.profile_table import load_profile

    out, rows = profiled
    table = pd.read_parquet(out / "profile.parquet")
    idle = table[table.kind == "after_idle"].sort_values("place")
    assert list(idle.place) == [0, *DECODE_BINS, REFERENCE_FROM]
    assert list(idle.samples) == [9, 9, 9, 9, 9 * (32 - REFERENCE_FROM + 1)]
    assert idle.factor.between(MIN_FACTOR, MAX_FACTOR).all() and (idle.seconds > 0).all()
    assert idle.factor.iloc[-1] == 1.0  # the reference: from its place on, a step costs the grid's price
    clock, _, _ = load_profile(str(out), "paged_torch")
    assert clock.after_idle.prefill == idle.factor.iloc[0]
    assert [f for _, f in clock.after_idle.decode] == list(idle.factor.iloc[1:])
    busy = table[table.kind == "after_busy"].sort_values("place")
    assert list(busy.place) == [0, *DECODE_BINS, REFERENCE_FROM]
    assert list(busy.samples) == [9, 9, 9, 9, 9 * (8 - REFERENCE_FROM + 1)]
    assert busy.factor.between(MIN_FACTOR, MAX_FACTOR).all() and busy.factor.iloc[-1] == 1.0
    assert clock.after_idle.busy.prefill == busy.factor.iloc[0]
    assert [f for _, f in clock.after_idle.busy.decode] == list(busy.factor.iloc[1:])
    assert "a busy prefill at" in rows[0]["notes"]
    assert rows[0]["clock_source"] == clock.id  # the factors are part of the profile's identity
    assert "after a sleep: the prefill at" in rows[0]["notes"]


def test_each_rate_is_simulated_on_the_profile_with_the_wall_runs_workload(profiled, compose, tmp_path):
    out, rows = profiled
    sims = [r for r in rows if r.get("request_rate") is not None and not r["chunked_prefill"]]
    assert [r["request_rate"] for r in sims] == [20, 40]
    assert all(r["clock"] == "simulated" and r["clock_source"] == rows[0]["clock_source"] for r in sims)
    assert all(r["ttft_ms_p50"] > 0 and r["tpot_ms_p50"] > 0 for r in sims)
    # a wall-clock run of the same config at 20 req/s served the very same requests
    (wall,), code = run_job(compose(["+impl=paged_torch", *SMALL, "arrival=poisson", "arrival.rate=20",
                                     "scenario.warmup=0"]), tmp_path)
    assert code == 0 and wall["workload_digest"] == sims[0]["workload_digest"]


def test_a_chunked_rate_is_simulated_with_mixed_steps_as_a_chunked_wall_run_names_itself(profiled, compose, tmp_path):
    out, rows = profiled
    (sim,) = [r for r in rows if r.get("request_rate") is not None and r["chunked_prefill"]]
    assert sim["request_rate"] == 20 and sim["max_num_batched_tokens"] == 8 and sim["tpot_ms_p50"] > 0
    plain = next(r for r in rows if r.get("request_rate") == 20 and not r["chunked_prefill"])
    # Chunks of at most 8 tokens take a prompt of 6-18 two or three steps where a whole prompt takes one: the first
    # token comes later (TPOT need not differ: at 20 req/s few of these 8 requests overlap, so both ran alike)
    assert sim["workload_digest"] == plain["workload_digest"] and sim["ttft_ms_p50"] > plain["ttft_ms_p50"]
    (wall,), code = run_job(compose(["+impl=paged_torch", *SMALL, "arrival=poisson", "arrival.rate=20",
                                     "scenario.warmup=0", "chunked_prefill=true", "max_num_batched_tokens=8"]), tmp_path)
    assert code == 0 and all(wall[k] == sim[k] for k in ("workload_digest", "chunked_prefill", "max_num_batched_tokens"))


def test_zero_passes_is_one_line(compose, tmp_path):
    rows, code = run_job(compose(["+impl=paged_torch", *SMALL, *PROFILE, "scenario.passes=0"]), tmp_path)
    assert code == 2 and "scenario.passes=0 must be >= 1" in rows[0]["error"]


def test_a_chunked_budget_below_the_batch_is_one_line(compose, tmp_path):
    rows, code = run_job(compose(["+impl=paged_torch", *SMALL, *PROFILE, "scenario.chunked_budget=3"]), tmp_path)
    assert code == 2 and "scenario.chunked_budget=3 must be >= batch=4" in rows[0]["error"]


def test_clock_profile_prices_a_capacity_run_and_names_its_profile(profiled, compose, tmp_path):
    out, rows = profiled
    (row,), code = run_job(compose(["+impl=paged_torch", *SMALL, "scenario=capacity", "arrival=poisson",
                                    "arrival.rate=20", f"clock_profile={out}"]), tmp_path)
    assert code == 0, row.get("error")
    assert row["clock"] == "simulated" and row["clock_source"] == rows[0]["clock_source"]
    sim = next(r for r in rows if r.get("request_rate") == 20)
    for f in ("ttft_ms_p50", "tpot_ms_p99", "e2el_ms_p50"):
        assert row[f] == pytest.approx(sim[f])  # the same requests, the same profile: the same prices


def test_a_profile_prices_the_read_of_the_impls_own_kernel(profiled, compose, tmp_path):
    """A profile is of its impl's kernel: paged_torch's reference reads every sequence up to the batch's
    longest context, so its simulated steps on the profile read batch x longest, as its wall steps record;
    paged_cuda's kernel (priced by the same table) reads each own context, and the roofline prices the
    PagedAttention kernel's read for both. A burst: the same schedule whichever the prices."""
    out, _ = profiled

    def reads(impl, *clock):
        (row,), code = run_job(compose([f"+impl={impl}", *SMALL, "scenario=capacity", *clock]), tmp_path / impl / clock[0])
        assert code == 0, row.get("error")
        steps = pd.read_parquet(tmp_path / impl / clock[0] / "steps.parquet")
        return steps.loc[steps.kind == "decode", "kv_tokens_read"].tolist()

    profile = (f"clock_profile={out}", "clock_profile_impl=paged_torch")
    padded, own = reads("paged_torch", *profile), reads("paged_cuda", *profile)
    assert len(padded) == len(own) and all(p >= o for p, o in zip(padded, own)) and padded != own
    whole = ("gpu=h100-sxm", "chunked_prefill=false")  # the profile's schedule, not the default engine's chunks
    assert reads("paged_torch", *whole) == reads("paged_cuda", *whole) == own


def test_a_profile_without_the_impl_gives_one_line_naming_what_it_has(profiled, compose, tmp_path):
    out, _ = profiled
    (row,), code = run_job(compose(["+impl=contiguous", *SMALL, "scenario=capacity", "arrival=poisson",
                                    "arrival.rate=20", f"clock_profile={out}"]), tmp_path)
    assert code == 2 and "has no profile of impl 'contiguous'; it profiles: paged_torch" in row["error"]
    (row,), code = run_job(compose(["+impl=contiguous", *SMALL, "scenario=capacity", "arrival=poisson",
                                    "arrival.rate=20", f"clock_profile={out}", "clock_profile_impl=paged_torch"]),
                           tmp_path / "other")
    assert code == 0 and row["clock_source"].startswith("profile-")


def test_settling_steps_are_whole_and_leave_room_in_the_context(compose):
    from types import SimpleNamespace

    from kvbench.harness.front.resolve import resolve
    from kvbench.harness.scenarios.profile import check

    def checked(settle: int) -> None:
        cfg = resolve(compose(["+impl=paged_torch", *SMALL, *PROFILE, f"scenario.settle_steps={settle}"]))
        check(SimpleNamespace(cfg=cfg))

    with pytest.raises(ConfigError, match=r"scenario.settle_steps=-1 must be >= 0"):
        checked(-1)
    # max_seq_len 64: the 40-token context leaves room for 20 steps (40 + 20 + 3 + 1 = 64), not 21
    checked(20)
    with pytest.raises(ConfigError, match=r"scenario.contexts holds 40: .*scenario.settle_steps=21 and "
                                          r"scenario.decode_steps=3 in max_seq_len=64"):
        checked(21)


@pytest.mark.parametrize("bad, message", [
    ("missing", "no such file or folder"),
    ("empty-dir", "holds no profile.parquet or profile.csv"),
    ("not-a-profile", r"not a profile table \(no column"),
])
def test_a_bad_clock_profile_is_one_line(compose, tmp_path, bad, message):
    from kvbench.harness.front.resolve import resolve

    path = tmp_path / bad
    if bad == "empty-dir":
        path.mkdir()
    elif bad == "not-a-profile":
        path = tmp_path / "profile.csv"
        path.write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match=message):
        resolve(compose(["+impl=paged_torch", *SMALL, "scenario=capacity", "arrival=poisson", "arrival.rate=20",
                         f"clock_profile={path}"]))


def test_clock_profile_on_a_wall_clock_scenario_is_refused(compose, tmp_path):
    from kvbench.harness.front.resolve import resolve

    with pytest.raises(ConfigError, match="clock_profile prices simulated steps"):
        resolve(compose(["+impl=paged_torch", *SMALL, f"clock_profile={tmp_path}"]))


def test_a_non_positive_or_non_finite_point_is_refused(tmp_path):
    from kvbench.harness.serving.profile_table import clock_from_table

    df = pd.DataFrame([{"impl": "x", "kind": "decode", "batch": 1, "context": 10.0, "tokens": None, "seconds": -1.0},
                       {"impl": "x", "kind": "prefill", "batch": None, "context": None, "tokens": 16, "seconds": 0.01}])
    with pytest.raises(ConfigError, match="not a positive, finite measurement"):
        clock_from_table(df, "x", "t.csv")


@pytest.fixture(scope="module")
def validated(tmp_path_factory):
    """A profile job that also serves its rates on the wall clock and searches the max rate on both clocks."""
    return _profile_job(tmp_path_factory, "validated", "scenario.wall=true", "scenario.max_rate=true",
                        "scenario.start_rps=20", "scenario.search_limit=40", "scenario.tolerance_rps=20",
                        "slo.normalized_latency_s=10")


def test_with_wall_each_rate_is_served_in_the_profiles_process_beside_its_simulation(validated):
    out, rows = validated
    served = [r for r in rows if r.get("clock") == "wall" and r.get("max_rate_rps") is None]
    sims = [r for r in rows if r.get("clock") == "simulated" and r.get("max_rate_rps") is None
            and r.get("machine_pace") is None]  # on the profile's own prices
    key = [(r["request_rate"], r["chunked_prefill"]) for r in sims]
    assert [(r["request_rate"], r["chunked_prefill"]) for r in served] == key == [(20, False), (40, False), (20, True)]
    for wall, sim in zip(served, sims):  # the very requests, scheduled alike, measured on the wall clock
        assert all(wall[k] == sim[k] for k in ("workload_digest", "chunked_prefill", "max_num_batched_tokens"))
        assert wall["scenario"] == "profile" and wall["tpot_ms_p50"] > 0 and wall["wall_s"] > 0
        assert "profile's process" in wall["notes"]
    # every wall run's steps and requests, told apart by rate and scheduling
    steps = pd.read_parquet(out / "steps.parquet")
    assert sorted(set(zip(steps.request_rate, steps.chunked_prefill))) == [(20, False), (20, True), (40, False)]
    assert (steps.duration_s > 0).all()
    # each decode and prefill step beside its price on the job's profile (the report's per-step error)
    whole = steps[steps.kind.isin(["decode", "prefill"])]
    assert (whole.price_s > 0).all() and steps[steps.kind == "mixed"].price_s.isna().all()
    requests = pd.read_parquet(out / "requests.parquet")
    assert len(requests) == 3 * 8


def test_with_wall_the_max_rate_is_searched_on_both_clocks_and_the_drift_is_recorded(validated):
    out, rows = validated
    searched = {r["clock"]: r for r in rows if r.get("max_rate_rps") is not None
                and (r["clock"] == "wall" or r.get("machine_pace") is None)}  # the search on the profile's prices
    assert set(searched) == {"wall", "simulated"} and searched["wall"]["probes"] >= 1
    assert searched["wall"]["max_rate_rps"] in (0.0, 20.0, 40.0)  # the search's bracket: start 20, limit 40
    # Its probes are rates the job already served with whole prompts (20 and 40): their rows' verdicts are
    # taken, not served again, and the search ends where those verdicts lead it.
    verdict = {r["request_rate"]: r["slo_pass"] for r in rows
               if r.get("clock") == "wall" and r.get("max_rate_rps") is None and not r["chunked_prefill"]}
    expected = 0.0 if not verdict[20] else (40.0 if verdict[40] else 20.0)
    assert searched["wall"]["max_rate_rps"] == expected
    assert f"{searched['wall']['probes']} probes ({searched['wall']['probes']} of them the rows served" \
        in searched["wall"]["notes"]
    # every probe of both searches, in order, in the job's rate_probes table: a reused one with its row's figures
    probes = pd.read_parquet(out / "rate_probes.parquet")
    for clock, row in searched.items():
        mine = probes[probes.clock == clock]
        assert len(mine) == row["probes"] and mine.rate_rps.iloc[0] == 20
        passed = mine[mine.slo_pass]
        assert (passed.rate_rps.max() if len(passed) else 0.0) == row["max_rate_rps"]
    walls = probes[probes.clock == "wall"].set_index("rate_rps")
    for rate, passed in verdict.items():
        if rate in walls.index:
            assert walls.loc[rate, "slo_pass"] == passed
            served_row = next(r for r in rows if r.get("clock") == "wall" and r.get("request_rate") == rate
                              and r.get("max_rate_rps") is None and not r["chunked_prefill"])
            assert walls.loc[rate, "normalized_latency_s"] == served_row["normalized_latency_s"]
    drift = rows[0]["profile_drift"]
    assert isinstance(drift, float) and -0.9 < drift < 9  # the last pass's points over the first's, less 1: finite
    table = pd.read_parquet(out / "profile.parquet")
    assert len(table[~table.kind.isin(["after_idle", "after_busy"])]) == 6  # one row a point: its passes pooled, not added as points


def test_with_wall_the_passes_span_the_wall_runs_and_their_steps_are_priced_by_the_whole_profile(validated):
    from kvbench.harness.serving.profile_table import clock_from_table

    out, rows = validated
    assert "measured in 3 passes spread over the wall runs" in rows[0]["notes"]
    table = pd.read_parquet(out / "profile.parquet")
    grid = table[~table.kind.isin(["after_idle", "after_busy"])]
    assert (grid.samples == 9).all()  # every pass's samples, the ones after the wall runs began included
    clock = clock_from_table(table, "paged_torch", "profile")
    steps = pd.read_parquet(out / "steps.parquet")
    decode, prefill = steps[steps.kind == "decode"], steps[steps.kind == "prefill"]
    assert len(decode) and len(prefill)
    # each priced as the simulation prices it: its shape's price times its place's after-idle factor; the first
    # step of each wall run (its engine slept until the first arrival) is a prefill at place 0
    factor = clock.after_idle.step_factor
    firsts = steps.groupby(["request_rate", "chunked_prefill"]).head(1)
    assert (firsts.place == 0).all() and (firsts.kind == "prefill").all()
    def where(rec) -> tuple[int, bool]:  # its place since the sleep, or since the busy prefill it follows
        return (rec.place, False) if pd.isna(rec.after_busy) else (int(rec.after_busy), True)

    for rec in decode.itertuples():
        assert rec.price_s == pytest.approx(clock.decode_s(int(rec.batch), int(rec.kv_tokens_read))
                                            * factor("decode", *where(rec)))
    for rec in prefill.itertuples():
        kind = "chunk" if rec.chunked_prefill else "prefill"  # a step of prompt chunks alone is no busy prefill
        assert rec.price_s == pytest.approx(clock.prefill_s(int(rec.tokens)) * factor(kind, *where(rec)))
    assert (prefill.place == 0).any()
    # a whole prompt's prefill between decode steps starts the busy curve's count: the steps after it count from it
    busy = prefill[(prefill.place > 0) & ~prefill.chunked_prefill]
    assert clock.after_idle.busy is not None and len(busy) and (busy.after_busy == 0).all()
    # a decode step never follows a sleep (the engine sleeps only with nothing running); one at place 0 follows a
    # stall of MIN_IDLE_S or more that was no sleep (the OS, on a loaded machine: 1 in 84,365 decode steps of this
    # session's validation runs), never the gap a pace meter's unit left (``pace_unit_s``, the engine's own time)
    from kvbench.harness.serving.after_idle import MIN_IDLE_S

    ends = steps.groupby(["request_rate", "chunked_prefill"], group_keys=False).apply(
        lambda g: g.start_s.shift(1) + g.duration_s.shift(1) + g.pace_unit_s.shift(1).fillna(0.0))
    cold = decode[decode.place == 0]
    assert len(cold) <= max(1, len(decode) // 20) and ((cold.start_s - ends[cold.index]) >= MIN_IDLE_S).all()


@pytest.fixture(scope="module")
def one_pass(tmp_path_factory):
    """A one-pass validating job (as the GPU check's), a rate served twice."""
    return _profile_job(tmp_path_factory, "one_pass", "scenario.wall=true", "scenario.passes=1",
                        "scenario.rates=[20,20]", "scenario.chunked_rates=[]")


def test_one_pass_re_times_part_of_its_grid_for_the_drift_and_a_rate_served_twice_is_two_rows(one_pass):
    out, rows = one_pass
    summary = rows[0]
    assert "passes spread" not in summary["notes"]
    assert isinstance(summary["profile_drift"], float) and -0.9 < summary["profile_drift"] < 9
    table = pd.read_parquet(out / "profile.parquet")
    grid = table[~table.kind.isin(["after_idle", "after_busy"])]
    assert len(grid) == 6 and (grid.samples == 3).all()  # one pass: 3 decode steps, 3 prefill forwards
    assert (table[table.kind == "after_idle"].place == 0).sum() == 1  # and one probe: 3 sleeps
    served = [r for r in rows if r.get("clock") == "wall"]
    assert len(served) == 2 and served[0] is not served[1]
    # wall, simulated on the profile's own prices, twice (and each run at its pace where the meter timed a unit in it)
    assert [r["request_rate"] for r in rows if r.get("clock") and r.get("machine_pace") is None
            or r.get("clock") == "wall"] == [20, 20, 20, 20]
    steps = pd.read_parquet(out / "steps.parquet")
    assert len(steps[steps.kind == "decode"]) and steps[steps.kind == "decode"].price_s.notna().all()


def test_passes_are_spread_evenly_over_the_tasks_the_last_after_the_last_task():
    from kvbench.harness.scenarios.profile import interleaved

    def order(tasks: int, passes: int) -> str:
        seen: list[str] = []
        interleaved([lambda i=i: seen.append(str(i)) for i in range(tasks)], passes, lambda: seen.append("P"))
        return "".join(seen)

    assert order(7, 2) == "0123P456P" and order(7, 1) == "0123456P" and order(2, 3) == "0PP1P"
    assert order(3, 0) == "012" and order(0, 2) == "PP"


def test_without_wall_no_wall_rows_and_no_drift(profiled):
    out, rows = profiled
    assert not any(r.get("clock") == "wall" for r in rows) and rows[0].get("profile_drift") is None


def test_with_wall_on_a_cpu_each_run_is_also_simulated_at_the_machines_pace_in_it(validated):
    """The pace meter (harness/measure/pace_meter.py) timed in the serving thread: each wall run and the wall search
    carry the machine's pace against the profile's, and each is simulated again with the profile's prices at it."""
    out, rows = validated
    served = [r for r in rows if r.get("clock") == "wall" and r.get("max_rate_rps") is None]
    sims = [r for r in rows if r.get("clock") == "simulated" and r.get("max_rate_rps") is None]
    own = [r for r in sims if r.get("machine_pace") is None]
    paced = {(r["request_rate"], r["chunked_prefill"]): r for r in sims if r.get("machine_pace") is not None}
    assert len(own) == len(served) == 3
    # a run the engine never settled in (SETTLED steps since a sleep) times no unit: no pace, no second simulation
    timed = [w for w in served if w.get("machine_pace") is not None]
    assert timed and len(paced) == len(timed)
    for wall, sim in zip(served, own):
        if wall.get("machine_pace") is None:
            continue
        at = paced[(wall["request_rate"], wall["chunked_prefill"])]
        assert 0.2 < wall["machine_pace"] < 5 and at["machine_pace"] == wall["machine_pace"]
        assert all(at[k] == sim[k] for k in ("workload_digest", "chunked_prefill", "max_num_batched_tokens",
                                             "request_rate", "clock_source"))
        assert at["notes"].startswith(f"priced at the machine's pace in its wall run: {wall['machine_pace']:.3f}x")
        if abs(wall["machine_pace"] - 1) > 0.02:  # the same requests, every price scaled: other latencies
            assert at["tpot_ms_p50"] != sim["tpot_ms_p50"]
    # each unit followed a step the engine ran SETTLED or more steps after its last sleep, the unit's own time
    # between two steps counted as the engine's, not as a sleep (its steps table's pace_unit_s)
    from kvbench.harness.measure.pace_meter import SETTLED

    steps = pd.read_parquet(out / "steps.parquet")
    followed = steps[steps.pace_unit_s.notna()]
    assert len(followed) and (followed.place >= SETTLED).all() and (followed.pace_unit_s > 0).all()
    searches = [r for r in rows if r.get("max_rate_rps") is not None]
    wall_search = next(r for r in searches if r["clock"] == "wall")
    paced_search = [r for r in searches if r["clock"] == "simulated" and r.get("machine_pace") is not None]
    assert len(paced_search) == 1 and paced_search[0]["machine_pace"] == wall_search["machine_pace"]
    assert "priced at the machine's pace in the wall search" in paced_search[0]["notes"]
