"""The kinds that keep something else than K and V per head: MLA's latent (full attention, its own bytes a token)
and a linear-attention layer's state (whole pages whatever the length; an error naming the kinds otherwise)."""

from __future__ import annotations

import pytest

from kvbench.impls.attention_kinds import (
    ATTENTION_KINDS, FullAttention, LatentAttention, LinearState, attention_kind, blocks_held, chunk_blocks,
)


def test_a_latent_is_full_attention_with_its_own_token() -> None:
    kind = LatentAttention(512, 64)
    assert isinstance(kind, FullAttention) and kind != FullAttention() and kind == LatentAttention(512, 64)
    assert kind.label == "latent" and kind.values_per_token == 576 and kind.window is None
    assert blocks_held(kind, 100, 16) == blocks_held(FullAttention(), 100, 16) == 7
    assert kind.first_needed_block(10_000, 16) == 0 and kind.tokens_needed(33) == 33


@pytest.mark.parametrize("length", [1, 15, 16, 17, 544, 100_000])
def test_a_state_holds_the_same_pages_at_any_length(length: int) -> None:
    kind = attention_kind("linear_attention", None, 536)
    assert kind == LinearState(536) and kind.label == "linear" and kind.window is None
    assert blocks_held(kind, length, 16) == 34 and chunk_blocks(kind, 0, length, 16) == 34
    assert kind.tokens_needed(length) == 536 and kind.first_needed_block(length, 16) == 0
    assert blocks_held(kind, 0, 16) == 0 and kind.tokens_needed(0) == 0
    assert kind.state_blocks(8) == 67 and kind.state_blocks(1024) == 1


def test_a_linear_layer_needs_a_state_and_unknown_kinds_name_the_supported_ones() -> None:
    assert "linear_attention" in ATTENTION_KINDS
    with pytest.raises(ValueError, match="linear_attention layer needs a state"):
        attention_kind("linear_attention", None, 0)
    with pytest.raises(ValueError, match="supported: full_attention, sliding_attention, linear_attention"):
        attention_kind("mamba", None, 536)
