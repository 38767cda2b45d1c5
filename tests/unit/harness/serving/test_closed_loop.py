"""Closed-loop arrivals: a turn arrives its think time after its predecessor finished, on both clocks."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from harness.front.job import run_job
from harness.serving.closed_loop import ClosedLoopSource
from harness.serving.sequence import Sequence
from harness.serving.workload import Request


def finished(request_id: int, at: float | None) -> Sequence:
    s = Sequence(0, request_id, 0, (1,), 1, output_ids=[1])
    s.finish_s = at
    return s


def test_first_turns_at_their_times_then_each_successor_after_its_finish_plus_think():
    reqs = [Request(i, (i,), 1) for i in range(5)]
    # user 0: 0 -> 2 -> 4; user 1: 1 -> 3
    src = ClosedLoopSource(reqs, [(0, 2, 4), (1, 3)], [0, 0, 0.5, 0.25, 1.0], [0.0, 0.1])
    assert [r.request_id for r in src.due(0.0)] == [0]
    assert src.next_arrival() == 0.1
    assert [(r.request_id, r.arrival_s) for r in src.due(0.2)] == [(1, 0.1)]
    assert src.next_arrival() is None  # nothing known until something finishes
    src.finished([finished(1, 0.3)])
    src.finished([finished(0, 0.4)])
    assert src.next_arrival() == pytest.approx(0.55)
    assert [r.request_id for r in src.due(0.9)] == [3, 2]  # by arrival: 0.55, then 0.9
    src.finished([finished(3, 1.0)])  # a last turn: nothing follows
    assert src.next_arrival() is None
    src.finished([finished(2, 1.0)])
    assert [(r.request_id, r.arrival_s) for r in src.due(5.0)] == [(4, 2.0)]
    assert [r.request_id for r in src.released] == [0, 1, 3, 2, 4]


def test_without_a_clock_a_turn_follows_at_once():
    reqs = [Request(i, (i,), 1) for i in range(2)]
    src = ClosedLoopSource(reqs, [(0, 1)], [0, 3.0], [0.0])
    src.due(0.0)
    src.finished([finished(0, None)])
    assert [r.request_id for r in src.due(0.0)] == [1]


def test_first_arrivals_one_per_conversation():
    with pytest.raises(ValueError, match="first arrivals"):
        ClosedLoopSource([], [(0,)], [0.0], [])


MULTI_TURN = ["model=tiny-llama", "dtype=float32", "max_seq_len=160", "device=cpu", "workload=multi_turn",
              "workload.users=3", "workload.turns=3", "workload.prompt_len=14", "workload.output_len=5",
              "workload.think_time_s=0.01", "batch=3", "block_size=4", "cpu_threads=1"]


def _run(compose, tmp_path, overrides):
    rows, code = run_job(compose(overrides), tmp_path)
    assert code == 0, rows[0].get("error")
    (row,) = rows
    return row, pd.read_parquet(tmp_path / "requests.parquet"), pd.read_parquet(tmp_path / "steps.parquet")


def _check_loop(row, requests_table, think):
    """Every later turn arrived no earlier than its predecessor's finish plus its think time."""
    from harness.serving.conversations import draw_conversations
    from harness.config import WorkloadConfig

    t = requests_table.set_index("request_id")
    conv = draw_conversations(WorkloadConfig(kind="multi_turn", users=3, turns=3, prompt_len=14, output_len=5,
                                             think_time_s=think), 32000, 160, 0)
    assert len(t) == 9
    for ids in conv.conversations:
        for prev, cur in zip(ids, ids[1:]):
            assert t.loc[cur, "arrival_s"] >= t.loc[prev, "finish_s"] + conv.think_s[cur] - 1e-9
    assert row["prefix_hit_rate"] > 0 and row["prefix_hit_rate"] <= row["prefix_hit_rate_ideal"] + 1e-12


def test_engine_multi_turn_equals_contiguous_and_closes_the_loop(compose, tmp_path):
    """The wall clock: paged_torch generates exactly contiguous's fp32 tokens over a closed loop, reuses
    prompt blocks across turns, and no turn arrives before its predecessor finished plus its think time."""
    rows, tokens = {}, {}
    for impl in ("contiguous", "paged_torch"):
        out = tmp_path / impl
        row, reqs, steps = _run(compose, out, [f"+impl={impl}", "scenario.warmup=0", *MULTI_TURN])
        rows[impl] = row
        tokens[impl] = [{k: v for k, v in json.loads(line).items() if k != "impl"}
                        for line in (out / "tokens.jsonl").read_text().splitlines()]
        assert steps["admitted_prompt_tokens"].iloc[-1] == row["prompt_tokens"]  # every turn was admitted
    assert tokens["contiguous"] == tokens["paged_torch"]
    assert rows["contiguous"]["output_digest"] == rows["paged_torch"]["output_digest"]
    assert rows["contiguous"]["prefix_hit_rate"] == 0 and rows["contiguous"]["evicted_blocks"] is None
    paged_reqs = pd.read_parquet(tmp_path / "paged_torch" / "requests.parquet")
    _check_loop(rows["paged_torch"], paged_reqs, 0.01)


def test_capacity_multi_turn_closes_the_loop_on_the_simulated_clock(compose, tmp_path):
    row, reqs, steps = _run(compose, tmp_path, ["scenario=capacity", "+impl=paged_torch", "gpu=h100-sxm",
                                                *MULTI_TURN])
    _check_loop(row, reqs, 0.01)
    assert row["duration_s"] >= 0.02  # two think times at least
    assert steps["admitted_prompt_tokens"].iloc[-1] == row["prompt_tokens"]
    assert steps["prefix_hit_rate"].iloc[-1] == pytest.approx(row["prefix_hit_rate"])
