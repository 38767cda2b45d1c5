"""The torch reference itself: its sync-free KV write and the host-given context bound."""

from __future__ import annotations

import pytest
import torch

from kvbench.kernels.reference import paged_decode_attention_ref, write_kv_ref


def write_one_by_one(key, value, k_cache, v_cache, slots):
    """The reference semantics spelt out: each token with a slot >= 0 lands there."""
    for i, slot in enumerate(slots.tolist()):
        if slot >= 0:
            k_cache.view(-1, *k_cache.shape[2:])[slot] = key[i]
            v_cache.view(-1, *v_cache.shape[2:])[slot] = value[i]


@pytest.mark.parametrize("pattern", ["none-skipped", "some-skipped", "all-skipped", "slot-0-kept", "empty"])
def test_write_skips_negative_slots_and_nothing_else(pattern):
    gen = torch.Generator().manual_seed(0)
    k_cache = torch.randn(4, 8, 2, 16, generator=gen)
    v_cache = torch.randn_like(k_cache)
    tokens = 0 if pattern == "empty" else 9
    key, value = torch.randn(2, tokens, 2, 16, generator=gen).unbind(0)
    slots = torch.randperm(32, generator=gen)[:tokens]
    if pattern == "some-skipped":
        slots[::3] = -1
    elif pattern == "all-skipped":
        slots[:] = -1
    elif pattern == "slot-0-kept":  # skipped tokens must not disturb a kept token's write to slot 0
        slots[0], slots[1:4] = 0, -1
    want_k, want_v = k_cache.clone(), v_cache.clone()
    write_one_by_one(key, value, want_k, want_v, slots)
    write_kv_ref(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


def test_write_without_skips_is_a_plain_scatter():
    k_cache, v_cache = torch.zeros(2, 2, 8, 4, 16).unbind(0)
    key, value = torch.randn(2, 5, 4, 16).unbind(0)
    slots = torch.tensor([7, 0, 3, 12, 5])
    want_k, want_v = k_cache.clone(), v_cache.clone()
    write_one_by_one(key, value, want_k, want_v, slots)
    write_kv_ref(key, value, k_cache, v_cache, slots, may_skip=False)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


def test_decode_with_the_host_bound_equals_reading_it():
    gen = torch.Generator().manual_seed(1)
    k_cache, v_cache = torch.randn(2, 20, 4, 2, 64, generator=gen).unbind(0)
    q = torch.randn(3, 8, 64, generator=gen)
    tables = torch.randperm(20, generator=gen)[:18].view(3, 6).to(torch.int32)
    lens = torch.tensor([21, 5, 24], dtype=torch.int32)
    read = paged_decode_attention_ref(q, k_cache, v_cache, tables, lens, 0.125)
    given = paged_decode_attention_ref(q, k_cache, v_cache, tables, lens, 0.125, max_context=24)
    assert torch.equal(read, given)
