"""Attention kinds: which blocks a query reads, what a sequence holds, and the kinds supported."""

from __future__ import annotations

import pytest

from kvbench.impls.attention_kinds import FullAttention, SlidingWindow, attention_kind, blocks_held, chunk_blocks


def test_a_sliding_window_reads_its_window_and_full_attention_everything():
    w = SlidingWindow(1024)
    assert w.first_needed_block(1023, 16) == 0 and w.first_needed_block(1024 + 15, 16) == 1
    assert FullAttention().first_needed_block(10**6, 16) == 0
    assert blocks_held(w, 32768, 16) == 64 and blocks_held(FullAttention(), 32768, 16) == 2048
    assert blocks_held(w, 100, 16) == 7 and blocks_held(w, 0, 16) == 0
    # a chunk from position 4096: blocks from its first query's window on, never the ones before
    assert chunk_blocks(w, 4096, 8192, 16) == 512 - (4096 - 1023) // 16


def test_an_unknown_kind_names_the_kinds_supported():
    with pytest.raises(ValueError, match="'chunked_attention' is not supported; supported: full_attention, "
                                         "sliding_attention"):
        attention_kind("chunked_attention", None)
    with pytest.raises(ValueError, match="sliding_window >= 1"):
        attention_kind("sliding_attention", None)
