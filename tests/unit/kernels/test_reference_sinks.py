"""The reference's attention sinks (kernels/reference.py) against the rule stated by loops (a softmax over
``[scores, sink]``, tests/helpers/sink_cases.py), with and without a window, and transformers' gpt-oss
attention itself."""

from __future__ import annotations

import pytest
import torch

from kvbench.kernels.reference import paged_decode_attention_ref
from tests.helpers.kernel_cases import make_decode_inputs
from tests.helpers.sink_cases import SINK_LENS, SINK_WINDOWS, make_sinks, naive_sink_decode


@pytest.mark.parametrize("window", SINK_WINDOWS)
@pytest.mark.parametrize("block_size,group", [(1, 1), (8, 4), (16, 2)])
def test_decode_with_sinks_matches_the_rule(window, block_size, group):
    q, k, v, tables, lens = make_decode_inputs(SINK_LENS, 2, group, 32, block_size, torch.float32, seed=window)
    sinks = make_sinks(q.shape[1], seed=window)
    got = paged_decode_attention_ref(q, k, v, tables, lens, 0.2, window=window, sinks=sinks)
    want = naive_sink_decode(q, k, v, tables, lens, 0.2, sinks, window)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got, paged_decode_attention_ref(q, k, v, tables, lens, 0.2, window=window), atol=1e-2)


def test_a_very_low_sink_is_no_sink_and_a_very_high_one_takes_all_the_weight():
    q, k, v, tables, lens = make_decode_inputs(SINK_LENS, 2, 2, 32, 8, torch.float32)
    plain = paged_decode_attention_ref(q, k, v, tables, lens, 0.2)
    low, high = torch.full((4,), -1e4), torch.full((4,), 1e4)
    torch.testing.assert_close(paged_decode_attention_ref(q, k, v, tables, lens, 0.2, sinks=low), plain)
    assert torch.equal(paged_decode_attention_ref(q, k, v, tables, lens, 0.2, sinks=high), torch.zeros_like(plain))


def test_the_rule_is_transformers_gpt_oss_attention():
    """transformers' gpt-oss eager attention (its sinks joined to every softmax) over one sequence's keys, its
    last query against the reference's decode of the same cache."""
    from types import SimpleNamespace

    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    heads, kv_heads, dim, length = 4, 2, 32, 11
    q, k, v, tables, lens = make_decode_inputs([length], kv_heads, heads // kv_heads, dim, 4, torch.float32)
    sinks = make_sinks(heads)
    keys = k.index_select(0, tables[0, :3].long()).flatten(0, 1)[:length]  # [L, KVH, D]
    values = v.index_select(0, tables[0, :3].long()).flatten(0, 1)[:length]
    module = SimpleNamespace(sinks=sinks, num_key_value_groups=heads // kv_heads, training=False)
    out, _ = eager_attention_forward(module, q[:, :, None, :], keys.transpose(0, 1)[None], values.transpose(0, 1)[None],
                                     None, scaling=dim**-0.5)
    got = paged_decode_attention_ref(q, k, v, tables, lens, dim**-0.5, sinks=sinks)
    torch.testing.assert_close(got, out[:, 0], atol=1e-5, rtol=1e-5)
