"""Closed-loop arrivals: a turn arrives its think time after its predecessor finished, on both clocks."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from kvbench.harness.front.job import run_job
from kvbench.harness.serving.closed_loop import ClosedLoopSource
from kvbench.harness.serving.sequence import Sequence
from kvbench.harness.serving.workload import Request


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
    from kvbench.harness.serving.conversations import draw_conversations
    from kvbench.harness.config import WorkloadConfig

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


# The case (a multi-turn closed loop at think time 0 with a host tier, the wall clock's hit rate against
# the simulated clock's) at test scale: 12 blocks of 4 float32 tokens (tiny-llama: 4096 bytes a token), too few
# for every user's history (two turns never fit: one is a third turn, the other ends its user's conversation,
# whose third turn is never sent), and a host tier of 12 blocks behind them.
BLOCK_BYTES = 4 * 4096
THINK_0 = [o for o in MULTI_TURN if not o.startswith("workload.think_time_s=")] + ["workload.think_time_s=0"]
SMALL_POOL = [f"device.kv_cache_gb={12 * BLOCK_BYTES / 1e9}", f"device.host_kv_gb={12 * BLOCK_BYTES / 1e9}"]
REUSE = ("prefix_hit_rate", "prefix_hit_rate_ideal", "cache_hit_tokens", "host_hit_tokens", "host_stored_blocks",
         "host_loaded_blocks", "evicted_blocks", "recomputed_tokens", "preemptions", "rejected", "prompt_tokens")


def _capacity(compose, tmp_path, overrides):
    rows, code = run_job(compose(["scenario=capacity", "+impl=paged_torch", *overrides]), tmp_path)
    assert code == 0, rows[0].get("error")
    return rows[0]


def _unsent(row) -> list[str]:
    return [n for n in (row["notes"] or "").split(" | ") if "not sent (an earlier turn" in n]


def test_both_clocks_count_the_same_prefix_hits_with_a_host_tier(compose, tmp_path):
    """The wall clock (real forwards: the model's own tokens fill each turn's last blocks), the simulator
    without a clock and the simulated clock (its synthetic tokens there) serve the same turns in the same
    order at think time 0, so they count the same hits, host hits and evictions; a turn too long for the
    pool is rejected on each, and each row says how many later turns were therefore not sent."""
    wall, _, _ = _run(compose, tmp_path / "wall", ["+impl=paged_torch", "scenario.warmup=0", *THINK_0, *SMALL_POOL])
    memory = _capacity(compose, tmp_path / "memory", [*THINK_0, *SMALL_POOL])
    simulated = _capacity(compose, tmp_path / "simulated", [*THINK_0, *SMALL_POOL, "gpu=h100-sxm"])
    assert (wall["clock"], simulated["clock"], simulated["dtype"]) == ("wall", "simulated", "float32")
    # the device pool evicts, the tier serves some of it back, and turns never fit
    assert wall["evicted_blocks"] > 0 and wall["host_hit_tokens"] > 0 and wall["rejected"] > 0
    assert 0 < wall["prefix_hit_rate"] < wall["prefix_hit_rate_ideal"]
    reuse = {k: wall[k] for k in REUSE}
    assert {k: memory[k] for k in REUSE} == reuse == {k: simulated[k] for k in REUSE}
    assert _unsent(wall) == _unsent(memory) == _unsent(simulated) == [
        ("1 of 9 turns not sent (an earlier turn of their conversation was rejected): prefix_hit_rate counts "
         "their prompt tokens as not hit")]


def test_a_simulated_gpu_pool_holds_twice_the_tokens_of_a_cpu_pool_of_the_same_bytes(compose, tmp_path):
    """Where the clocks' rates differ at think time 0, the pools do: dtype=auto is bfloat16 on a simulated GPU
    and float32 on this CPU, so the same device.kv_cache_gb and host_kv_gb hold twice the tokens there. The
    bfloat16 run's reuse is the float32 run's at twice the bytes, not the float32 run's at the same bytes."""
    auto = [o for o in THINK_0 if o != "dtype=float32"]
    bf16 = _capacity(compose, tmp_path / "bf16", [*auto, *SMALL_POOL, "gpu=h100-sxm"])
    doubled = [f"device.kv_cache_gb={24 * BLOCK_BYTES / 1e9}", f"device.host_kv_gb={24 * BLOCK_BYTES / 1e9}"]
    fp32_doubled = _capacity(compose, tmp_path / "fp32x2", [*THINK_0, *doubled, "gpu=h100-sxm"])
    fp32 = _capacity(compose, tmp_path / "fp32", [*THINK_0, *SMALL_POOL, "gpu=h100-sxm"])
    assert (bf16["dtype"], bf16["kv_bytes_per_token"] * 2) == ("bfloat16", fp32["kv_bytes_per_token"])
    assert {k: bf16[k] for k in REUSE} == {k: fp32_doubled[k] for k in REUSE}
    assert bf16["prefix_hit_rate"] > fp32["prefix_hit_rate"]


def test_the_unsent_note():
    from kvbench.harness.serving.closed_loop import unsent_note

    assert unsent_note(9, 9) is None
    assert unsent_note(9, 5).startswith("4 of 9 turns not sent")
