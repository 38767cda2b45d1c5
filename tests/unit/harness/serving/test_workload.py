"""The workload generator: deterministic, shaped as configured, and bad sizes rejected."""

from __future__ import annotations

import statistics

import pytest

from kvbench.harness.config import WorkloadConfig
from kvbench.harness.errors import ConfigError
from kvbench.harness.serving.workload import generate_requests, workload_digest


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

    from kvbench.harness.config import WorkloadConfig
    from kvbench.harness.serving.workload import draw_workload

    tracemalloc.start()
    wl = draw_workload(WorkloadConfig(name="chat", prompt_len=64, output_len=8), 50, 10**9, 256, seed=1)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 20 * 2**20  # was 10**9 int objects (~36 GB) for a table of every id
    assert max(max(r.prompt_ids) for r in wl.requests) > 2**20  # ids from the whole vocabulary


def test_interned_and_tabled_ids_are_the_same_tokens(monkeypatch):
    """Beyond TOKEN_TABLE_MAX ids are interned as drawn: the same requests, byte for byte, and shared objects."""
    from kvbench.harness.config import WorkloadConfig
    from kvbench.harness.serving import request
    from kvbench.harness.serving.workload import draw_workload, workload_digest

    cfg = WorkloadConfig(name="chat", prompt_len=40, output_len=8, shared_prefix_len=4)
    tabled = draw_workload(cfg, 30, 5000, 128, seed=7)
    monkeypatch.setattr(request, "TOKEN_TABLE_MAX", 0)  # shared_ints' table (harness/serving/request.py)
    interned = draw_workload(cfg, 30, 5000, 128, seed=7)
    assert workload_digest(interned.requests) == workload_digest(tabled.requests)
    ids = [t for r in interned.requests for t in r.prompt_ids[4:] if t > 256]  # past the prefix; beyond small ints
    by_value = {}
    assert all(by_value.setdefault(t, t) is t for t in ids)  # one object per id


# ---- the fast paths against their straightforward definitions ----------------------------------------

def _json_digest(requests) -> str:
    """workload_digest as first written: the sha256 of each request's json.dumps record, in turn."""
    import hashlib
    import json

    h = hashlib.sha256()
    for r in requests:
        record = [r.request_id, r.prompt_ids, r.output_len, r.n]
        h.update(json.dumps(record + [r.arrival_s] if r.arrival_s else record).encode())
    return h.hexdigest()[:16]


def _awkward_requests():
    from kvbench.harness.serving.workload import Request

    ids = (0, 9, 10, 99, 100, 999, 1000, 65535, 128255, 2**20 - 1, 2**20, 10**9, 2**31, 10**12, 2**63 - 1)
    return [
        Request(0, ids, 5),
        Request(1, list(ids[:4]), 1, 3),  # a list, not a tuple; n > 1
        Request(2, (), 7),  # no prompt at all
        Request(3, (7,), 1, 1, 0.0),
        Request(4, (1, 2, 3), 2, 1, 0),  # an int 0 arrival: no arrival in the record, as 0.0
        Request(5, (1, 2, 3), 2, 2, 1.5),
        Request(6, (4,) * 33, 2, 1, 1e-7),
        Request(7, (5, 6), 2, 1, 3.0),
        Request(8, (5, 6), 2, 1, 1e20),
        Request(9, (5, 6), 2, 1, 2),  # an int arrival
        Request(10**6, (123456,), 10**4, 16, 0.1 + 0.2),
    ]


@pytest.mark.parametrize("chunk", [None, 1, 5, 40])
def test_digest_is_the_json_records_hash(monkeypatch, chunk):
    """The numpy-made records hash exactly as json.dumps's text, at every chunking of the requests."""
    from kvbench.harness.serving import workload

    if chunk is not None:
        monkeypatch.setattr(workload, "DRAW_CHUNK_TOKENS", chunk)
    reqs = _awkward_requests()
    assert workload.workload_digest(reqs) == _json_digest(reqs)
    for cut in range(len(reqs)):  # every prefix: a chunk may end anywhere
        assert workload.workload_digest(reqs[:cut]) == _json_digest(reqs[:cut])


def test_digest_falls_back_to_json_where_numpy_would_differ():
    """Ids json writes otherwise (negative, bool) or not at all (numpy ints): json.dumps decides, as before."""
    import numpy as np

    from kvbench.harness.serving.workload import Request, workload_digest

    odd = [Request(0, (-1, 5, -300), 2), Request(1, (True, 3), 1), Request(True, (1,), False, 1, 0.5)]
    assert workload_digest(odd) == _json_digest(odd)
    with pytest.raises(TypeError):
        workload_digest([Request(0, (np.int64(3),), 1)])


def test_digest_of_drawn_workloads_is_the_json_records_hash():
    cfg = WorkloadConfig(distribution="lognormal", prompt_len=300, output_len=30, shared_prefix_len=8, n=2)
    reqs = generate_requests(cfg, 200, 128256, 2048, seed=5)
    assert workload_digest(reqs) == _json_digest(reqs)


@pytest.mark.parametrize("chunk", [None, 7, 300])
@pytest.mark.parametrize("dist,prefix,n,vocab", [("lognormal", 8, 2, 128256), ("fixed", 0, 1, 32000),
                                                 ("uniform", 40, 3, 5), ("lognormal", 0, 1, 2**21)])
def test_digest_made_while_drawing_is_the_json_records_hash(monkeypatch, chunk, dist, prefix, n, vocab):
    """The digest draw_workload makes from the drawn ids (before they become ints) is the JSON records' hash,
    with and without a shared prefix, at any chunking of the draws, small and large vocabularies."""
    from kvbench.harness.serving import workload

    if chunk is not None:
        monkeypatch.setattr(workload, "DRAW_CHUNK_TOKENS", chunk)
    cfg = WorkloadConfig(distribution=dist, prompt_len=60, output_len=20, shared_prefix_len=prefix, n=n)
    drawn = workload.draw_workload(cfg, 57, vocab, 256, seed=11)
    assert drawn.digest is not None and not any(r.arrival_s for r in drawn.requests)
    assert drawn.digest == _json_digest(drawn.requests) == workload_digest(drawn.requests)


def _drawn_one_call_each(cfg: WorkloadConfig, num_requests: int, vocab: int, max_seq_len: int, seed: int):
    """draw_workload's plain path as first written: one numpy call per request's token ids."""
    import numpy as np

    from kvbench.harness.serving.workload import Request, _clip, draw_lengths, shared_ints

    rng = np.random.Generator(np.random.PCG64(seed))
    prompt_lens = draw_lengths(cfg, cfg.prompt_len, num_requests, rng)
    output_lens = draw_lengths(cfg, cfg.output_len, num_requests, rng)
    prefix = rng.integers(0, vocab, size=cfg.shared_prefix_len).tolist()
    token_ids = shared_ints(vocab)
    requests = []
    for rid in range(num_requests):
        p, o = _clip(int(max(prompt_lens[rid], cfg.shared_prefix_len + 1)), int(output_lens[rid]), max_seq_len)
        requests.append(Request(rid, tuple(prefix + token_ids(rng.integers(0, vocab, size=p - len(prefix)))), o, cfg.n))
    return requests


@pytest.mark.parametrize("vocab", [1, 2, 77, 128256, 2**20 + 3, 10**9, 2**33, 2**40])
@pytest.mark.parametrize("chunk", [None, 1, 37])
def test_chunked_draw_is_the_one_call_per_request_draw(monkeypatch, vocab, chunk):
    """Several requests' ids per numpy call are the ids of one call each (32- and 64-bit draws, odd sizes)."""
    import numpy as np

    from kvbench.harness.serving import workload

    if chunk is not None:
        monkeypatch.setattr(workload, "DRAW_CHUNK_TOKENS", chunk)
    cfg = WorkloadConfig(distribution="uniform", prompt_len=20, output_len=5, spread=0.9, shared_prefix_len=3, n=2)
    want = _drawn_one_call_each(cfg, 60, vocab, 64, seed=11)
    assert workload.generate_requests(cfg, 60, vocab, 64, seed=11) == want
    # draw_prompts leaves the generator where the per-request calls did
    rng = np.random.Generator(np.random.PCG64(3))
    sizes = [0, 1, 3, 2, 0, 5, 1, 8]
    got = workload.draw_prompts(rng, vocab, sizes, workload.shared_ints(vocab), (9,))
    ref = np.random.Generator(np.random.PCG64(3))
    assert got == [(9, *ref.integers(0, vocab, size=k).tolist()) for k in sizes]
    assert rng.integers(0, 2**62) == ref.integers(0, 2**62)


def test_drawn_prompts_share_their_int_objects():
    """The table still hands out one int object per id (100,000 prompts would hold 50M ints otherwise)."""
    reqs = generate_requests(WorkloadConfig(distribution="fixed", prompt_len=300, output_len=4), 20, 1000, 512, 0)
    by_value = {}
    assert all(by_value.setdefault(t, t) is t for r in reqs for t in r.prompt_ids)


def test_output_spread_draws_outputs_apart_from_fixed_prompts_and_leaves_the_default_draw_alone():
    cfg = WorkloadConfig(distribution="uniform", prompt_len=256, output_len=100, spread=0.0, output_spread=0.28)
    reqs = generate_requests(cfg, 400, 1000, 384, seed=3)
    assert {len(r.prompt_ids) for r in reqs} == {256}
    outs = [r.output_len for r in reqs]
    assert min(outs) == 72 and max(outs) == 128 and 95 < sum(outs) / len(outs) < 105
    # output_spread unset: the prompts' spread, the very draw of before
    same = WorkloadConfig(distribution="uniform", prompt_len=40, output_len=30, spread=0.5)
    again = WorkloadConfig(distribution="uniform", prompt_len=40, output_len=30, spread=0.5, output_spread=0.5)
    wider = WorkloadConfig(distribution="uniform", prompt_len=40, output_len=30, spread=0.5, output_spread=0.9)
    assert generate_requests(same, 50, 1000, 128, seed=1) == generate_requests(again, 50, 1000, 128, seed=1)
    assert generate_requests(same, 50, 1000, 128, seed=1) != generate_requests(wider, 50, 1000, 128, seed=1)
