"""Teacher-forced comparison: the run under test fed the reference's tokens, position by position."""

from __future__ import annotations

import pytest
import torch

from kvbench.harness.errors import ConfigError
from kvbench.harness.front.groups import load_impl
from kvbench.harness.front.resolve import resolve
from kvbench.harness.kv.factory import build_cache
from kvbench.harness.model.weights import build_model
from kvbench.harness.serving.engine import Engine
from kvbench.harness.serving.forced import compare
from kvbench.harness.serving.workload import Request

GEN = torch.Generator().manual_seed(3)
REQUESTS = [Request(i, tuple(torch.randint(0, 4096, (n,), generator=GEN).tolist()), out)
            for i, (n, out) in enumerate([(13, 9), (30, 5), (7, 12)])]


@pytest.fixture
def setup(compose):
    cfg = resolve(compose(["+impl=paged_torch", "model=tiny-llama", "dtype=float32", "device=cpu",
                           "max_seq_len=64", "block_size=8", "batch=2"]))
    model = build_model(cfg.model, torch.float32, torch.device("cpu"), cfg.seed)
    return cfg, model


def engines(cfg, model, impl_names: list[str], noise: float = 0.0, kv_bytes: int = 2**21):
    """One engine factory per impl name over a fresh cache; ``noise`` perturbs the second one's attention output."""
    factories = []
    for i, name in enumerate(impl_names):
        impl = load_impl(name)

        def make(sampler, impl=impl, perturb=noise if i == 1 else 0.0):
            cache = build_cache(impl, cfg, kv_bytes, torch.device("cpu"))
            if perturb:
                decode, gen = cache.forward_decode, torch.Generator().manual_seed(1)

                def noisy(layer, q, k, v, meta):
                    out = decode(layer, q, k, v, meta)
                    return out + perturb * torch.randn(out.shape, generator=gen)

                cache.forward_decode = noisy
            return Engine(model, cache, cfg.batch, cfg.max_num_batched_tokens, sampler=sampler)

        factories.append(make)
    return factories


def test_the_same_model_through_two_caches_agrees_at_every_position(setup):
    cfg, model = setup
    ref, test = engines(cfg, model, ["contiguous", "paged_torch"])
    tally, tokens = compare(ref, test, REQUESTS, cfg.model.vocab_size)
    assert tally.positions == sum(r.output_len for r in REQUESTS)
    assert tally.top1_agreement == 1.0 and tally.kl_mean < 1e-6  # fp32 rounding of two sums in other orders
    assert tally.perplexity == pytest.approx(tally.ref_perplexity, rel=1e-5)
    greedy = Engine(model, build_cache(cfg.impl, cfg, 2**21, torch.device("cpu")), cfg.batch,
                    cfg.max_num_batched_tokens).run(REQUESTS)
    assert tokens == {s.request_id: s.output_ids for s in greedy.sequences}  # the reference's own greedy tokens


def test_a_perturbed_cache_moves_the_distributions_and_is_still_fed_the_reference_tokens(setup):
    cfg, model = setup
    ref, test = engines(cfg, model, ["paged_torch", "paged_torch"], noise=0.5)
    tally, tokens = compare(ref, test, REQUESTS, cfg.model.vocab_size)
    assert tally.kl_mean > 1e-4 and tally.perplexity > tally.ref_perplexity
    assert tally.positions == sum(r.output_len for r in REQUESTS)  # every position compared once


def test_forced_tokens_are_fed_to_both_runs(setup):
    cfg, model = setup
    forced = {r.request_id: [(7 * r.request_id + j) % 4096 for j in range(r.output_len)] for r in REQUESTS}
    ref, test = engines(cfg, model, ["contiguous", "paged_torch"])
    tally, tokens = compare(ref, test, REQUESTS, cfg.model.vocab_size, forced=forced)
    assert tokens == forced and tally.top1_agreement == 1.0


def test_too_large_a_reference_and_parallel_sampling_are_refused(setup):
    cfg, model = setup
    ref, test = engines(cfg, model, ["contiguous", "paged_torch"])
    with pytest.raises(ConfigError, match="lower workload.num_requests or workload.output_len"):
        compare(ref, test, [Request(0, (1, 2), 10**6)], 4096)
    with pytest.raises(ConfigError, match="parallel sampling"):
        compare(ref, test, [Request(0, (1, 2), 3, n=2)], 4096)
