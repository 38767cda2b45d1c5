"""Pre-packed GEMMs on a CPU (LlamaModel.prepack, build_model's default for fp32), both kinds (kvbench's
own kernel, oneDNN's): the same logits as plain F.linear within fp32 rounding, used only for
decode-sized row counts, and repacked when a weight changes in place. The kernel itself against a
reference at awkward shapes, on every instruction set: tests/unit/kernels/test_dense_op_gemm.py."""

from __future__ import annotations

import pytest
import torch

from kvbench.harness.model import llama
from kvbench.harness.model.config import ModelConfig
from kvbench.harness.model.llama import PACKED_MAX_ROWS, PackedWeight, prepack_supported
from kvbench.harness.model.packed_linear import MIN_ROWS, pack_kind
from kvbench.harness.model.weights import build_model
from kvbench.kernels import dense_op

pytestmark = pytest.mark.skipif(not prepack_supported("cpu", torch.float32), reason="torch without oneDNN")

SHAPE = ModelConfig(num_layers=2)  # tiny-llama's shape, two layers
# oneDNN's always; kvbench's where its op library builds (a C++ compiler)
KINDS = ["onednn"] + (["kvbench"] if dense_op.dense_ops_unavailable() is None else [])


def _attend(layer, q, k, v):
    group = q.shape[1] // v.shape[1]
    return v.repeat_interleave(group, dim=1) + 0.01 * layer * q


@pytest.fixture(scope="module", params=KINDS)
def pair(request):
    """The same weights (one seed), packed for each kind, and plain."""
    packed = build_model(SHAPE, torch.float32, "cpu", seed=3, prepack=False)
    packed.prepack(request.param)
    return packed, build_model(SHAPE, torch.float32, "cpu", seed=3, prepack=False)


def test_the_default_kind_is_kvbench_where_its_ops_load():
    model = build_model(SHAPE, torch.float32, "cpu", seed=0)
    assert model.packed_kind == pack_kind() == ("kvbench" if "kvbench" in KINDS else "onednn")
    with pytest.raises(ValueError, match="unknown packed GEMM kind 'mkl'; choose one of"):
        model.prepack("mkl")


def test_build_model_packs_fp32_on_cpu_only_by_default(pair, monkeypatch):
    packed, plain = pair
    packed = build_model(SHAPE, torch.float32, "cpu", seed=3)
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
    assert len(calls) == (4 * SHAPE.num_layers + 1 if MIN_ROWS[packed.packed_kind] <= n <= PACKED_MAX_ROWS else 0)


@pytest.mark.parametrize("kind", KINDS)
def test_a_weight_changed_in_place_is_repacked(kind):
    model = build_model(SHAPE, torch.float32, "cpu", seed=4, prepack=False)
    model.prepack(kind)
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
    assert MIN_ROWS == {"kvbench": 1, "onednn": 2} and 32 <= PACKED_MAX_ROWS < 128
    assert llama.prepack_supported("cpu", torch.float32)
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


@pytest.mark.skipif("kvbench" not in KINDS, reason="kvbench's op library did not build")
def test_packing_for_kvbench_loads_its_op_library_in_a_fresh_process():
    """A model built unfused and unpacked has not loaded the library yet: prepack("kvbench") loads it."""
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    script = ("import torch\nfrom kvbench.harness.model.config import ModelConfig\nfrom kvbench.harness.model.weights import build_model\n"
              "m = build_model(ModelConfig(num_layers=1), torch.float32, 'cpu', seed=0, prepack=False, fuse=False)\n"
              "m.prepack('kvbench')\n"
              "att = lambda layer, q, k, v: v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)\n"
              "print(tuple(m(torch.arange(3), torch.arange(3), att).shape), m.packed_kind)\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-3:] == ["(3,", f"{SHAPE.vocab_size})", "kvbench"]
