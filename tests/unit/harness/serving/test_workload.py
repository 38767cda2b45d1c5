"""The workload generator: deterministic, shaped as configured, and bad sizes rejected."""

from __future__ import annotations

import statistics

import pytest

from harness.config import WorkloadConfig
from harness.errors import ConfigError
from harness.serving.workload import generate_requests, workload_digest


def test_same_seed_same_requests_byte_for_byte():
    cfg = WorkloadConfig(distribution="lognormal", prompt_len=50, output_len=30, shared_prefix_len=8, n=2)
    a = generate_requests(cfg, 40, 1000, 512, seed=3)
    b = generate_requests(cfg, 40, 1000, 512, seed=3)
    c = generate_requests(cfg, 40, 1000, 512, seed=4)
    assert a == b and workload_digest(a) == workload_digest(b)
    assert workload_digest(a) != workload_digest(c)


@pytest.mark.parametrize("dist", ["fixed", "uniform", "lognormal"])
def test_distributions_have_the_requested_mean(dist):
    cfg = WorkloadConfig(distribution=dist, prompt_len=100, output_len=60, spread=0.5, sigma=0.5)
    reqs = generate_requests(cfg, 3000, 1000, 4096, seed=0)
    assert statistics.mean(len(r.prompt_ids) for r in reqs) == pytest.approx(100, rel=0.05)
    assert statistics.mean(r.output_len for r in reqs) == pytest.approx(60, rel=0.05)
    if dist == "fixed":
        assert {len(r.prompt_ids) for r in reqs} == {100}
    else:
        assert len({len(r.prompt_ids) for r in reqs}) > 10
    if dist == "lognormal":  # long-tailed: the mean sits above the median
        assert statistics.median(r.output_len for r in reqs) < 60


def test_shared_prefix_and_limits():
    cfg = WorkloadConfig(distribution="uniform", prompt_len=40, output_len=300, shared_prefix_len=16)
    reqs = generate_requests(cfg, 50, 77, 256, seed=1)
    assert len({r.prompt_ids[:16] for r in reqs}) == 1
    assert len({r.prompt_ids[16:] for r in reqs}) == 50
    assert all(r.total_len <= 256 and r.output_len >= 1 for r in reqs)  # tails clipped to max_seq_len
    assert all(0 <= t < 77 for r in reqs for t in r.prompt_ids)


def test_fixed_request_longer_than_max_seq_len_is_an_error():
    with pytest.raises(ConfigError, match="max_seq_len"):
        generate_requests(WorkloadConfig(distribution="fixed", prompt_len=100, output_len=50), 2, 100, 128, 0)


# ---- no run takes the machine down: the token draw never materialises the vocabulary ---------------

def test_a_huge_vocabulary_is_drawn_without_materialising_it():
    import tracemalloc

    from harness.config import WorkloadConfig
    from harness.serving.workload import draw_workload

    tracemalloc.start()
    wl = draw_workload(WorkloadConfig(name="chat", prompt_len=64, output_len=8), 50, 10**9, 256, seed=1)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 20 * 2**20  # was 10**9 int objects (~36 GB) for a table of every id
    assert max(max(r.prompt_ids) for r in wl.requests) > 2**20  # ids from the whole vocabulary


def test_interned_and_tabled_ids_are_the_same_tokens(monkeypatch):
    """Beyond TOKEN_TABLE_MAX ids are interned as drawn: the same requests, byte for byte, and shared objects."""
    from harness.config import WorkloadConfig
    from harness.serving import workload
    from harness.serving.workload import draw_workload, workload_digest

    cfg = WorkloadConfig(name="chat", prompt_len=40, output_len=8, shared_prefix_len=4)
    tabled = draw_workload(cfg, 30, 5000, 128, seed=7)
    monkeypatch.setattr(workload, "TOKEN_TABLE_MAX", 0)
    interned = draw_workload(cfg, 30, 5000, 128, seed=7)
    assert workload_digest(interned.requests) == workload_digest(tabled.requests)
    ids = [t for r in interned.requests for t in r.prompt_ids[4:] if t > 256]  # past the prefix; beyond small ints
    by_value = {}
    assert all(by_value.setdefault(t, t) is t for t in ids)  # one object per id
