"""The flex kernel (kernels/flex.py, eager: its CPU path) against the fp32 reference and, with sinks, against
a loop that states the sink rule; fresh random inputs of awkward sizes (tests/helpers/kernel_cases.py)."""

from __future__ import annotations

import pytest
import torch

from kvbench.kernels.flex import flex_decode
from kvbench.kernels.reference import gather_kv, paged_decode_attention_ref
from kvbench.kernels.validate import KernelArgumentError
from tests.helpers.kernel_cases import assert_close_for_dtype, make_decode_inputs

LENS = [1, 5, 17, 97]
WINDOWS = [0, 1, 5, 16, 200]


def loop_decode(q, k_cache, v_cache, tables, lens, scale, window, sinks) -> torch.Tensor:
    """Per sequence and head: softmax over [its last ``window`` keys' scores, its head's sink], sink column
    dropped, times V; in fp32, by loops."""
    out = torch.empty(q.shape, dtype=torch.float32)
    group = q.shape[1] // k_cache.shape[2]
    for b, n in enumerate(lens.tolist()):
        first = max(0, n - window) if window > 0 else 0
        k = gather_kv(k_cache, tables[b], n)[first:].float()
        v = gather_kv(v_cache, tables[b], n)[first:].float()
        for h in range(q.shape[1]):
            scores = (k[:, h // group] @ q[b, h].float()) * scale
            probs = torch.softmax(torch.cat([scores, sinks[h].reshape(1)]), dim=0)[:-1]
            out[b, h] = probs @ v[:, h // group]
    return out


def _inputs(dtype, block_size, group, seed):
    return make_decode_inputs(LENS, 2, group, 32, block_size, dtype, seed=seed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("block_size,group", [(8, 4), (16, 1)])
@pytest.mark.parametrize("window", WINDOWS)
def test_decode_matches_the_reference(dtype, block_size, group, window):
    q, k, v, tables, lens = _inputs(dtype, block_size, group, seed=window)
    out = torch.full_like(q, float("nan"))
    got = flex_decode(q, k, v, tables, lens, 0.2, out, window=window)
    assert got is out and not torch.isnan(out).any()
    want = paged_decode_attention_ref(q.float(), k.float(), v.float(), tables, lens, 0.2, window=window)
    assert_close_for_dtype(out, want, dtype)
    if 0 < window < max(LENS):  # the window changed the answer: a kernel ignoring it cannot pass
        assert not torch.allclose(want, paged_decode_attention_ref(q.float(), k.float(), v.float(), tables, lens, 0.2),
                                  atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("window", [0, 5, 200])
def test_sinks_join_the_denominator(dtype, window):
    q, k, v, tables, lens = _inputs(dtype, 8, 4, seed=10 + window)
    sinks = torch.rand(q.shape[1], generator=torch.Generator().manual_seed(window)) * 7 - 1  # some dominate
    got = flex_decode(q, k, v, tables, lens, 0.2, window=window, sinks=sinks)
    assert_close_for_dtype(got, loop_decode(q, k, v, tables, lens, 0.2, window, sinks), dtype)
    plain = paged_decode_attention_ref(q.float(), k.float(), v.float(), tables, lens, 0.2, window=window)
    assert not torch.allclose(got.float(), plain, atol=1e-2)  # the sinks took weight


def test_max_context_narrows_the_table_read_only():
    """A host bound reads fewer table columns; the junk past each sequence's blocks is never used."""
    q, k, v, tables, lens = _inputs(torch.float32, 8, 2, seed=3)
    full = flex_decode(q, k, v, tables, lens, 0.2)
    torch.testing.assert_close(flex_decode(q, k, v, tables, lens, 0.2, max_context=max(LENS)), full)


def test_bad_arguments_are_refused_in_one_line():
    q, k, v, tables, lens = _inputs(torch.float32, 8, 2, seed=4)
    with pytest.raises(KernelArgumentError, match="sinks"):
        flex_decode(q, k, v, tables, lens, 0.2, sinks=torch.zeros(3))
    with pytest.raises(KernelArgumentError, match="dtype"):
        flex_decode(q.double(), k, v, tables, lens, 0.2)
    with pytest.raises(KernelArgumentError, match="auto"):
        flex_decode(q, k, v, tables, lens, 0.2, scales=object())
    with pytest.raises(ValueError, match="allowed eager, compiled"):
        flex_decode(q, k, v, tables, lens, 0.2, mode="fast")
