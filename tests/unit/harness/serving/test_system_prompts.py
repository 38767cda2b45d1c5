"""workload.kind=system_prompt: Zipf-popular system prompts before distinct user parts."""

from __future__ import annotations

import numpy as np
import pytest

from kvbench.harness.config import WorkloadConfig
from kvbench.harness.serving.system_prompts import draw_system_prompt_workload, zipf_weights
from kvbench.harness.serving.workload import draw_workload, workload_digest


def cfg(**kw) -> WorkloadConfig:
    base = dict(name="system_prompt", kind="system_prompt", distribution="lognormal", prompt_len=30, output_len=10,
                system_prompts=6, system_prompt_len=48, zipf_exponent=1.2)
    return WorkloadConfig(**{**base, **kw})


def systems_of(requests, length):
    return [r.prompt_ids[:length] for r in requests]


def test_deterministic_and_seeded():
    a = draw_system_prompt_workload(cfg(), 50, 32000, 1024, seed=1)
    b = draw_workload(cfg(), 50, 32000, 1024, seed=1)
    c = draw_system_prompt_workload(cfg(), 50, 32000, 1024, seed=2)
    assert workload_digest(a.requests) == workload_digest(b.requests) != workload_digest(c.requests)


def test_each_prompt_is_one_of_n_system_prompts_then_its_own_user_part():
    w = draw_system_prompt_workload(cfg(distribution="fixed"), 200, 32000, 1024, seed=3)
    systems = systems_of(w.requests, 48)
    assert len(set(systems)) <= 6
    assert all(len(r.prompt_ids) == 48 + 30 and r.output_len == 10 for r in w.requests)
    users = [r.prompt_ids[48:] for r in w.requests]
    assert len(set(users)) == len(users)  # distinct user parts


def test_popularity_follows_zipf():
    n = 20_000
    w = draw_system_prompt_workload(cfg(distribution="fixed", prompt_len=2, output_len=1), n, 32000, 1024, seed=4)
    systems = systems_of(w.requests, 48)
    counts = sorted((systems.count(s) for s in set(systems)), reverse=True)
    expected = zipf_weights(6, 1.2) * n
    assert len(counts) == 6
    assert np.allclose(counts, expected, rtol=0.08)
    assert zipf_weights(4, 0.0) == pytest.approx([0.25] * 4)


def test_a_long_user_part_is_clipped_to_max_seq_len():
    w = draw_system_prompt_workload(cfg(distribution="fixed", prompt_len=500), 5, 32000, 128, seed=0)
    assert all(r.total_len <= 128 and len(r.prompt_ids) > 48 for r in w.requests)
    assert w.notes and "clipped to max_seq_len=128" in w.notes[0]
