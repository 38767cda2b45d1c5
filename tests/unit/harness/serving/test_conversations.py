"""workload.kind=multi_turn: each turn's prompt is its user's whole history plus a new message."""

from __future__ import annotations

import numpy as np
import pytest

from kvbench.harness.config import WorkloadConfig
from kvbench.harness.serving.conversations import draw_conversations, think_times
from kvbench.harness.serving.workload import draw_workload, workload_digest


def cfg(**kw) -> WorkloadConfig:
    base = dict(name="multi_turn", kind="multi_turn", distribution="lognormal", prompt_len=40, output_len=12,
                users=5, turns=4, think_time_s=0.5)
    return WorkloadConfig(**{**base, **kw})


def test_same_seed_same_requests_other_seed_others():
    a = draw_conversations(cfg(), 1000, 4096, seed=3)
    b = draw_conversations(cfg(), 1000, 4096, seed=3)
    c = draw_conversations(cfg(), 1000, 4096, seed=4)
    assert workload_digest(a.requests) == workload_digest(b.requests) != workload_digest(c.requests)
    assert (a.conversations, a.think_s) == (b.conversations, b.think_s)


@pytest.mark.parametrize("distribution", ["fixed", "uniform", "lognormal"])
def test_turn_k_starts_with_turn_k_minus_1s_prompt_and_answer(distribution):
    w = draw_conversations(cfg(distribution=distribution), 50, 100_000, seed=11)
    reqs = w.requests
    assert len(w.conversations) == 5
    for ids in w.conversations:
        assert len(ids) == 4
        for prev, cur in zip(ids, ids[1:]):
            p, c = reqs[prev], reqs[cur]
            # the previous prompt, then an answer of exactly its output length, then a new message
            assert c.prompt_ids[:len(p.prompt_ids)] == p.prompt_ids
            assert len(c.prompt_ids) > len(p.prompt_ids) + p.output_len
    # every user's history is its own: first turns share nothing (a vocabulary of 50 shares tokens, not prompts)
    firsts = [reqs[ids[0]].prompt_ids for ids in w.conversations]
    assert len(set(firsts)) == len(firsts)


def test_lengths_are_drawn_like_the_distribution():
    w = draw_conversations(cfg(distribution="fixed", users=3, turns=3), 1000, 4096, seed=0)
    reqs = w.requests
    for ids in w.conversations:
        lens = [len(reqs[i].prompt_ids) for i in ids]
        assert lens == [40, 40 + 12 + 40, 2 * (40 + 12) + 40]
        assert all(reqs[i].output_len == 12 for i in ids)


def test_ids_go_turn_by_turn_so_users_interleave():
    w = draw_conversations(cfg(users=3, turns=2), 1000, 4096, seed=0)
    assert w.conversations == ((0, 3), (1, 4), (2, 5))
    assert [r.request_id for r in w.requests] == list(range(6))
    assert w.think_s[:3] == (0.0, 0.0, 0.0) and all(t > 0 for t in w.think_s[3:])


def test_a_conversation_that_outgrows_max_seq_len_ends_early_and_says_so():
    w = draw_conversations(cfg(distribution="fixed", users=2, turns=5), 1000, 200, seed=0)
    # turn k (from 0) needs 52 k + 52 tokens: turns 0..2 fit 200, turn 3 (208) does not
    assert [len(ids) for ids in w.conversations] == [3, 3]
    assert all(r.total_len <= 200 for r in w.requests)
    assert any("2 of 2 conversations ended early at max_seq_len=200 (4 of 10 turns not sent)" in n for n in w.notes)


def test_a_first_turn_longer_than_max_seq_len_is_clipped():
    w = draw_conversations(cfg(distribution="fixed", prompt_len=300, users=1, turns=2), 1000, 256, seed=0)
    (ids,) = w.conversations
    assert len(ids) == 1 and w.requests[0].total_len == 256
    assert any("first turns clipped" in n for n in w.notes)


def test_draw_workload_dispatches_on_kind():
    w = draw_workload(cfg(), 20, 1000, 4096, seed=1)
    assert w.conversations is not None and len(w.requests) == 20


def test_think_times_have_the_mean_and_their_own_stream():
    exp = think_times(cfg(think_time_s=2.0), 20_000, seed=5)
    assert exp.mean() == pytest.approx(2.0, rel=0.05) and exp.std() == pytest.approx(2.0, rel=0.05)
    assert np.all(think_times(cfg(think_distribution="fixed", think_time_s=0.3), 7, 5) == 0.3)
    # the think times do not move the token ids or lengths
    a = draw_conversations(cfg(think_time_s=0.1), 1000, 4096, seed=2)
    b = draw_conversations(cfg(think_time_s=9.0), 1000, 4096, seed=2)
    assert workload_digest(a.requests) == workload_digest(b.requests) and a.think_s != b.think_s
