"""The fused element-wise CPU ops (kernels/dense_op.py) against torch's op-at-a-time reference.

Fresh random rows at awkward sizes (odd row counts, hidden sizes off the 16-lane partial sums, head
dims from 2 to 256). RoPE and the q/k/v split are bit-identical to harness/model/rope.py; RMSNorm's sum
and silu's exp are computed in another order / by another polynomial, so they are held to a few ulp.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kvbench.harness.model.rope import apply_rotary
from kvbench.kernels import dense_op

pytestmark = pytest.mark.skipif(dense_op.dense_ops_unavailable() is not None,
                                reason=f"the fused ops did not build: {dense_op.dense_ops_unavailable()}")


def _norm_ref(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def _rows(gen: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return scale * torch.randn(*shape, generator=gen)


@pytest.mark.parametrize("rows", [1, 3, 8, 37])
@pytest.mark.parametrize("hidden", [5, 96, 512, 1027])
def test_rms_norm_matches_torch_within_a_few_ulp(rows, hidden):
    gen = torch.Generator().manual_seed(rows * 7919 + hidden)
    x, w = _rows(gen, rows, hidden, scale=3.0), _rows(gen, hidden)
    got, want = dense_op.rms_norm(x, w, 1e-5), _norm_ref(x, w, 1e-5)
    torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-6)
    assert got.shape == x.shape and got.is_contiguous()


@pytest.mark.parametrize("rows", [1, 6, 33])
@pytest.mark.parametrize("hidden", [17, 256, 640])
def test_add_rms_norm_is_the_add_exactly_then_the_norm(rows, hidden):
    gen = torch.Generator().manual_seed(rows + 31 * hidden)
    h, d, w = _rows(gen, rows, hidden), _rows(gen, rows, hidden, scale=0.5), _rows(gen, hidden)
    s, y = dense_op.add_rms_norm(h, d, w, 1e-6)
    assert torch.equal(s, h + d)  # the residual stream is bit-exact
    torch.testing.assert_close(y, _norm_ref(h + d, w, 1e-6), rtol=2e-6, atol=1e-6)


def test_norm_of_a_zero_row_is_zero_not_nan():
    w = torch.ones(64)
    assert torch.equal(dense_op.rms_norm(torch.zeros(2, 64), w, 1e-5), torch.zeros(2, 64))


@pytest.mark.parametrize("rows", [1, 5, 16])
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(4, 2, 64), (8, 8, 32), (6, 1, 128), (3, 3, 2), (2, 1, 256)])
def test_rope_qkv_is_bit_identical_to_the_torch_path(rows, heads, kv_heads, dim):
    gen = torch.Generator().manual_seed(rows * 131 + heads * 17 + dim)
    qkv = _rows(gen, rows, (heads + 2 * kv_heads) * dim)
    positions = torch.randint(0, 4096, (rows,), generator=gen)
    inv = 1.0 / (10000.0 ** (torch.arange(0, dim, 2).float() / dim))
    freqs = positions[:, None].float() * inv[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    q, k, v = dense_op.rope_qkv(qkv, cos, sin, heads, kv_heads)
    qk, want_v = qkv.split([(heads + kv_heads) * dim, kv_heads * dim], dim=-1)
    want_q, want_k = apply_rotary(qk.view(rows, heads + kv_heads, dim), cos, sin).split([heads, kv_heads], dim=1)
    assert torch.equal(q, want_q) and torch.equal(k, want_k)
    assert torch.equal(v, want_v.reshape(rows, kv_heads, dim))
    assert all(t.is_contiguous() for t in (q, k, v))


@pytest.mark.parametrize("rows", [1, 7, 64])
@pytest.mark.parametrize("inter", [1, 33, 1536])
def test_silu_mul_matches_torch_within_a_few_ulp(rows, inter):
    gen = torch.Generator().manual_seed(rows * 3 + inter)
    x = _rows(gen, rows, 2 * inter, scale=4.0)
    gate, up = x.chunk(2, dim=-1)
    torch.testing.assert_close(dense_op.silu_mul(x), F.silu(gate) * up, rtol=2e-6, atol=1e-7)


def test_silu_mul_at_the_exp_range_ends():
    gate = torch.tensor([-1e4, -120.0, -88.0, -87.0, -20.0, -1e-30, 0.0, 1e-30, 20.0, 87.0, 88.5, 120.0, 1e4])
    x = torch.cat([gate, torch.full_like(gate, 1.5)])[None]
    got, want = dense_op.silu_mul(x)[0], F.silu(gate) * 1.5
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-30)


@pytest.mark.parametrize(("op", "args", "message"), [
    ("rms_norm", (torch.ones(2, 8, dtype=torch.float64), torch.ones(8), 1e-5), "float32 CPU"),
    ("rms_norm", (torch.ones(8, 2).t(), torch.ones(8), 1e-5), "contiguous"),
    ("rms_norm", (torch.ones(2, 8), torch.ones(7), 1e-5), "weight has 7 elements"),
    ("add_rms_norm", (torch.ones(2, 8), torch.ones(3, 8), torch.ones(8), 1e-5), "differ in shape"),
    ("rope_qkv", (torch.ones(2, 5 * 8), torch.ones(2, 8), torch.ones(2, 8), 2, 2), "is not"),
    ("silu_mul", (torch.ones(2, 7),), "must be"),
])
def test_bad_arguments_are_named(op, args, message):
    with pytest.raises(RuntimeError, match=message):
        getattr(dense_op, op)(*args)


# Row lengths around the vector widths (8 and 16 lanes, two chains: 16 and 32 a pass), and a vocabulary.
ARGMAX_VOCABS = (1, 2, 7, 8, 15, 16, 17, 31, 32, 33, 47, 64, 100, 4097, 32000)


def argmax_failures(seed: int) -> list[str]:
    """argmax_rows against torch.argmax on fresh random rows at every ARGMAX_VOCABS length: plain rows,
    rows whose max is repeated (a tie: the first), rows with a NaN (the first NaN) anywhere, -inf rows,
    all-NaN rows and constant rows. Returns the failures (empty when all agree); also run at every
    narrower instruction set (tests/unit/kernels/test_dense_op_gemm.py)."""
    gen = torch.Generator().manual_seed(seed)
    failures = []
    for vocab in ARGMAX_VOCABS:
        x = torch.randn(9, vocab, generator=gen)
        picks = torch.randint(0, vocab, (9, 3), generator=gen)
        x[1, picks[1]] = x[1].max() + 1.0  # the max at up to three places
        x[2, picks[2, 0]] = float("nan")
        x[3, picks[3]] = float("nan")
        x[3, picks[3, 0]] = float("inf")
        x[4] = float("-inf")
        x[5] = float("nan")
        x[6] = 0.5
        x[7, picks[7]] = float("inf")
        x[8] = x[8].round()  # many ties among small integers
        got, want = dense_op.argmax_rows(x), x.argmax(-1)
        if not torch.equal(got, want):
            failures.append(f"vocab {vocab}: {got.tolist()} != {want.tolist()}")
    return failures


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_argmax_rows_equals_torch_argmax(seed):
    assert argmax_failures(seed) == []


def test_argmax_rows_takes_the_first_of_a_tie_and_a_nan_first():
    x = torch.zeros(4, 40)
    x[0, [7, 3, 30]] = 2.0  # a tie: the first index
    x[1, [5, 33]] = float("inf")
    x[2, 38] = float("nan")  # a NaN wins wherever it is, as in torch
    x[2, 1] = 9.0
    x[3] = -1.0
    x[3, [0, 20]] = -0.0  # -0 == 0: the first
    assert dense_op.argmax_rows(x).tolist() == x.argmax(-1).tolist() == [3, 5, 38, 0]
