"""Pre-packed GEMMs on a CPU (LlamaModel.prepack, build_model's default for fp32): the same logits as
plain F.linear within fp32 rounding, the same greedy tokens through every CPU impl, used only for
decode-sized row counts, and repacked when a weight changes in place."""

from __future__ import annotations

import pytest
import torch

from harness.model import llama
from harness.model.config import ModelConfig
from harness.model.llama import PACKED_MAX_ROWS, PACKED_MIN_ROWS, PackedWeight, prepack_supported
from harness.model.weights import build_model

pytestmark = pytest.mark.skipif(not prepack_supported("cpu", torch.float32), reason="torch without oneDNN")

SHAPE = ModelConfig(num_layers=2)  # tiny-llama's shape, two layers


def _attend(layer, q, k, v):
    group = q.shape[1] // v.shape[1]
    return v.repeat_interleave(group, dim=1) + 0.01 * layer * q


@pytest.fixture(scope="module")
def pair():
    """The same weights (one seed), packed and plain."""
    return (build_model(SHAPE, torch.float32, "cpu", seed=3),
            build_model(SHAPE, torch.float32, "cpu", seed=3, prepack=False))


def test_build_model_packs_fp32_on_cpu_only_by_default(pair, monkeypatch):
    packed, plain = pair
    assert packed.packed and not plain.packed
    assert not build_model(SHAPE, torch.bfloat16, "cpu", seed=0).packed  # measured at fp32 only
    monkeypatch.setenv("KVBENCH_CPU_PREPACK", "0")
    assert not build_model(SHAPE, torch.float32, "cpu", seed=0).packed
    assert build_model(SHAPE, torch.float32, "cpu", seed=0, prepack=True).packed  # explicit wins
    with pytest.raises(ValueError, match="float32 on a CPU"):
        build_model(SHAPE, torch.bfloat16, "cpu", seed=0).prepack()


def test_packing_leaves_parameters_and_state_dict_alone(pair):
    packed, plain = pair
    assert packed.num_parameter_bytes() == plain.num_parameter_bytes()
    a, b = packed.state_dict(), plain.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("n", [1, 2, 7, 32, PACKED_MAX_ROWS, PACKED_MAX_ROWS + 1, 200])
def test_packed_logits_match_plain(pair, n, monkeypatch):
    packed, plain = pair
    gen = torch.Generator().manual_seed(n)
    ids = torch.randint(0, SHAPE.vocab_size, (n,), generator=gen)
    pos = torch.randint(0, 100, (n,), generator=gen)
    calls = []
    real = PackedWeight.linear
    monkeypatch.setattr(PackedWeight, "linear", lambda self, x, bias: calls.append(x.shape[0]) or real(self, x, bias))
    with torch.inference_mode():
        want = plain(ids, pos, _attend)
        got = packed(ids, pos, _attend)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=5e-5)
    assert got.argmax(-1).equal(want.argmax(-1))
    # every linear (4 per layer) and the logits run packed at decode sizes; none outside them
    assert len(calls) == (4 * SHAPE.num_layers + 1 if PACKED_MIN_ROWS <= n <= PACKED_MAX_ROWS else 0)


def test_a_weight_changed_in_place_is_repacked():
    model = build_model(SHAPE, torch.float32, "cpu", seed=4)
    ref = build_model(SHAPE, torch.float32, "cpu", seed=4, prepack=False)
    ids, pos = torch.arange(6), torch.arange(6)
    with torch.no_grad():
        for m in (model, ref):
            m.layers[1].mlp.down_proj.weight.mul_(0.5)
            m.lm_head.weight.add_(0.1)
    with torch.inference_mode():
        torch.testing.assert_close(model(ids, pos, _attend), ref(ids, pos, _attend), rtol=1e-5, atol=5e-5)


def test_unpack_goes_back_to_f_linear(monkeypatch):
    model = build_model(SHAPE, torch.float32, "cpu", seed=0)
    model.unpack()
    assert not model.packed
    monkeypatch.setattr(PackedWeight, "linear", lambda *a: pytest.fail("packed GEMM after unpack"))
    with torch.inference_mode():
        model(torch.arange(4), torch.arange(4), _attend)


def test_the_row_window_is_decode_sized():
    assert PACKED_MIN_ROWS == 2 and 32 <= PACKED_MAX_ROWS < 128 and llama.prepack_supported("cpu", torch.float32)
    assert not llama.prepack_supported("meta", torch.float32)


def test_gemm_row_breaks_sit_on_both_sides_of_every_kernel_change(pair, monkeypatch):
    """The profile measures a step at each break (harness/scenarios/profile_grid.py: profile_grid): they must be
    exactly the row counts where the GEMM's kernel changes, and the one on its other side."""
    packed, plain = pair
    weight = packed.layers[0].mlp.down_proj
    ran_packed = []
    real = PackedWeight.linear
    monkeypatch.setattr(PackedWeight, "linear", lambda self, x, bias: ran_packed.append(x.shape[0]) or real(self, x, bias))
    top = 3 * PACKED_MAX_ROWS
    with torch.inference_mode():
        for n in range(1, top + 1):
            llama.linear(torch.randn(n, weight.weight.shape[1]), weight.weight, None, weight.packed)
    kernel = {n: n in ran_packed for n in range(1, top + 1)}
    changes = [n for n in range(1, top) if kernel[n] != kernel[n + 1]]
    assert changes and sorted(packed.gemm_row_breaks()) == sorted({m for n in changes for m in (n, n + 1)})
    assert plain.gemm_row_breaks() == ()  # F.linear at every row count: nothing to measure apart
