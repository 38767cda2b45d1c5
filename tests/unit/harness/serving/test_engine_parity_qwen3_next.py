"""Qwen3-Next token for token: a tiny random checkpoint (three Gated DeltaNet layers and a gated full-attention one,
partial RoPE, 2 of 6 experts a token beside the gated shared expert) generates transformers' greedy tokens through
the grouped paged cache under kv_manager=hybrid, every paged kernel attending the full layer, while each linear
layer's state lives in its sequence's state pages of the pool (impls/state_pages.py): carried across decode steps
and prompt chunks, copied when a fork's first write parts it from its parent. Each comparison has a sibling that
breaks the state's path and gets other tokens."""

from __future__ import annotations

import pytest
import torch

from kvbench.harness.serving.engine import Engine
from kvbench.harness.serving.request import Request
from kvbench.impls.base import StateRows
from tests.helpers.models import QWEN3_NEXT_CASES
from tests.helpers.parity import family_fixture, serve_on_the_command_line
from tests.helpers.parity import generate as _generate
from tests.helpers.parity import grouped_cache as _cache
from tests.helpers.parity import hf_tokens as _hf_tokens
from tests.helpers.parity import random_requests as _requests

pytest.importorskip("transformers")

# prompts shorter and longer than a 16-token chunk; generations of several steps
SHAPES = [(30, 10), (7, 12), (45, 6)]


family = family_fixture(QWEN3_NEXT_CASES, SHAPES)


def test_the_checkpoint_has_both_kinds(family):
    cfg = family[0]
    assert cfg.layer_types == ["linear_attention"] * 3 + ["full_attention"]
    assert cfg.partial_rotary_factor == 0.25 and cfg.shared_expert_intermediate_size == 32
    groups = _cache(cfg, "hybrid", "torch", 4).allocator.groups
    assert [g.kind.label for g in groups].count("linear") == 3
    # block 4: a state of 8 slots takes 2 pages a sequence, so a state spans pages that need not be adjacent
    assert {g.kind.state_blocks(4) for g in groups if g.kind.label == "linear"} == {2}


@pytest.mark.parametrize("kernel,block_size", [("torch", 8), ("cuda", 4), ("flex", 16)])
def test_greedy_tokens_equal_transformers(family, kernel, block_size):
    cfg, model, _, requests, want = family
    assert _generate(model, _cache(cfg, "hybrid", kernel, block_size), requests) == want


@pytest.mark.parametrize("kernel,block_size", [("torch", 8), ("cuda", 4)])
def test_chunked_prefill_carries_the_state_across_chunks(family, kernel, block_size):
    """Chunks of 16 tokens beside the running decodes: each chunk starts from the state the last one left."""
    cfg, model, _, requests, want = family
    assert _generate(model, _cache(cfg, "hybrid", kernel, block_size), requests, chunked=True) == want


def test_a_state_not_carried_between_chunks_gives_other_tokens(family):
    """The sibling: every chunk and decode step starting from a zero state is another model."""
    cfg, model, _, requests, want = family
    cache = _cache(cfg, "hybrid", "torch", 8)
    real = cache.linear_state

    def forgetful(layer, meta):
        rows = real(layer, meta)
        return StateRows(rows.lengths, rows.capacity, lambda: torch.zeros_like(rows.read()), rows.write)

    cache.linear_state = forgetful
    got = _generate(model, cache, requests, chunked=True)
    assert got != want and all(len(got[r.request_id]) == r.output_len for r in requests)


def _small_cache(cfg, blocks: int):
    """The hybrid cache of ``_cache`` with a pool of ``blocks`` pages of 8 tokens: too few for every request."""
    from kvbench.harness.kv.groups import kv_groups, layer_bytes_per_token
    from kvbench.impls.group_pool import PoolGroup
    from kvbench.impls.kinds import PoolSpec, TensorSpec, cache_kind

    groups, layer = kv_groups(cfg, "hybrid"), layer_bytes_per_token(cfg, "float32")
    spec = PoolSpec(kv_bytes=blocks * 8 * layer, bytes_per_token=cfg.num_layers * layer, max_seq_len=64,
                    block_size=8, max_num_seqs=4, min_tokens=1, watermark=0.0, prefix_caching=False,
                    groups=tuple(PoolGroup(g.kind, g.num_layers, g.page_layers, g.pool) for g in groups),
                    pool_kv_bytes=(blocks * 8 * layer,), layer_bytes=layer, group_layers=tuple(g.layers for g in groups))
    tensors = TensorSpec(num_layers=cfg.num_layers, num_heads=cfg.num_heads, kv_heads=cfg.num_kv_heads,
                         head_dim=cfg.head_dim, dtype=torch.float32, device=torch.device("cpu"),
                         scale=cfg.softmax_scale)
    return cache_kind("paged").cache(spec, tensors, "torch")


def test_a_preempted_sequence_recomputes_its_state_from_zero(family):
    """A pool too small for every request: the scheduler preempts (its state pages freed, then taken again, maybe
    others'), and the recomputed prompt starts its state from zeros: the tokens stay transformers'."""
    cfg, model, _, requests, want = family
    cache = _small_cache(cfg, 12)
    assert cache.allocator.max_sequence_tokens() == (12 - 3) * 8  # a state page off each linear group
    result = Engine(model, cache, 4, 512).run(requests)
    assert result.preemptions > 0
    assert {s.request_id: list(s.output_ids) for s in result.sequences} == want


def test_paged_triton_in_the_interpreter(family):
    """Two short requests (Triton's interpreter is slow on CPU)."""
    cfg, model, hf, _, _ = family
    requests = _requests(cfg.vocab_size, [(20, 4), (9, 5)])
    assert _generate(model, _cache(cfg, "hybrid", "triton", 8), requests) == _hf_tokens(hf, requests)


def _samples(model, cache, requests) -> dict[tuple[int, int], list[int]]:
    engine = Engine(model, cache, 8, 512)
    return {(s.request_id, s.sample): list(s.output_ids) for s in engine.run(requests).sequences}


def _second_sample(hf, request: Request) -> list[int]:
    """transformers' tokens for the engine's sample 1: the prompt's second-ranked next token, then greedy."""
    with torch.no_grad():
        second = int(hf(torch.tensor([request.prompt_ids])).logits[0, -1].topk(2).indices[1])
    rest = _hf_tokens(hf, [Request(0, (*request.prompt_ids, second), request.output_len - 1)])[0]
    return [second, *rest]


@pytest.mark.parametrize("broken", [False, True])
def test_parallel_samples_fork_the_state(family, broken):
    """Two samples a prompt share its state pages after the prefill; the first to write copies them (a SlotCopy a
    page): sample 0 is transformers' greedy continuation, sample 1 its continuation from the second-ranked token.
    The sibling skips the copies: the copy's pages then hold no state, and sample 1 (or 0) goes elsewhere."""
    cfg, model, hf, requests, want = family
    forked = [Request(i, r.prompt_ids, r.output_len, 2) for i, r in enumerate(requests[:2])]
    cache = _cache(cfg, "hybrid", "cuda", 4)
    if broken:
        cache.copy_slots = lambda copies: None
    got = _samples(model, cache, forked)
    expected = {(r.request_id, 0): want[r.request_id] for r in forked}
    expected |= {(r.request_id, 1): _second_sample(hf, r) for r in forked}
    assert (got != expected) if broken else (got == expected)


def test_a_decode_run_from_the_command_line_generates_transformers_tokens(family, compose, tmp_path):
    """``python -m harness +impl=paged_torch model.path=DIR model.weights=path kv_manager=hybrid ...``: the row is ok
    and every request's tokens (tokens.jsonl) are transformers' greedy continuation of its prompt."""
    cfg, _, hf, _, _ = family
    _, got, requests = serve_on_the_command_line(compose, tmp_path, cfg, "paged_torch", 20, 6, "kv_manager=hybrid")
    assert len(requests) == 3 and all(len(r.prompt_ids) == 20 and r.output_len == 6 for r in requests)
    assert got == _hf_tokens(hf, requests)
