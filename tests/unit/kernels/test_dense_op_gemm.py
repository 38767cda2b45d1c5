"""kvbench's packed GEMM (kernels/csrc/packed_gemm_cpu.cpp) against a float64 reference.

Fresh random inputs at awkward shapes: row counts across the register blocks (1-12 rows per block,
and remainders), output columns off the 16-column panels, K from 1 up, with and without bias. Each
instruction set the CPU offers runs in its own process (``KVBENCH_GEMM_ISA`` is read when the library
loads), so the AVX2 and portable paths are tested on an AVX-512 machine too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from kvbench.kernels import dense_op
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.skipif(dense_op.dense_ops_unavailable() is not None,
                                reason=f"the op library did not build: {dense_op.dense_ops_unavailable()}")

SHAPES = [(1, 1, 1), (1, 17, 5), (2, 16, 64), (3, 33, 7), (5, 48, 130), (7, 100, 31), (8, 1000, 512),
          (12, 31, 96), (13, 64, 65), (25, 250, 200), (64, 520, 256)]


def _check(shapes, seed: int) -> list[str]:
    """Every shape with and without bias; returns the failures (empty when all pass)."""
    failures = []
    gen = torch.Generator().manual_seed(seed)
    for m, n, k in shapes:
        w, x, b = torch.randn(n, k, generator=gen), torch.randn(m, k, generator=gen), torch.randn(n, generator=gen)
        packed = dense_op.pack_linear_weight(w)
        want = x.double() @ w.double().t()
        for bias in (None, b):
            got = dense_op.packed_linear(x, packed, n, bias)
            ref = want if bias is None else want + b.double()
            # fp32 accumulation over k: a bound that grows with sqrt(k) times the terms' size
            tol = 4e-6 * (k ** 0.5) * (x.abs().max() * w.abs().max()).item() + 1e-6
            err = (got.double() - ref).abs().max().item()
            if got.shape != (m, n) or err > tol:
                failures.append(f"{m}x{n}x{k} bias={bias is not None}: shape {tuple(got.shape)}, err {err:.3g} > {tol:.3g}")
    return failures


def test_every_shape_matches_the_reference():
    assert _check(SHAPES, seed=0) == []
    assert dense_op.packed_linear_isa() in ("avx512", "avx2", "portable")


ISA_SCRIPT = """
import json, sys
from tests.unit.kernels.test_dense_op_gemm import SHAPES, _check
from tests.unit.kernels.test_dense_op import argmax_failures
from kvbench.kernels import dense_op
print(json.dumps({"isa": dense_op.packed_linear_isa(), "failures": _check(SHAPES, seed=1) + argmax_failures(3)}))
"""


def _narrower_isas() -> list[str]:
    isa = dense_op.packed_linear_isa()
    return {"avx512": ["avx2", "portable"], "avx2": ["portable"], "portable": []}[isa]


@pytest.mark.parametrize("isa", ["avx2", "portable"])
def test_each_narrower_instruction_set_matches_the_reference(isa):
    if isa not in _narrower_isas():
        pytest.skip(f"this CPU runs {dense_op.packed_linear_isa()}: {isa} is not narrower")
    env = {**os.environ, "KVBENCH_GEMM_ISA": isa, "PYTHONPATH": str(REPO_ROOT)}
    out = subprocess.run([sys.executable, "-c", ISA_SCRIPT], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"isa": isa, "failures": []}


def test_a_row_does_not_depend_on_the_rows_beside_it():
    """One FMA chain per output over k in order: the same row gives the same bits at every batch size."""
    gen = torch.Generator().manual_seed(5)
    w, x = torch.randn(77, 300, generator=gen), torch.randn(29, 300, generator=gen)
    packed = dense_op.pack_linear_weight(w)
    full = dense_op.packed_linear(x, packed, 77)
    for m in (1, 2, 5, 12, 13):
        assert torch.equal(dense_op.packed_linear(x[:m].contiguous(), packed, 77), full[:m])


def test_empty_inputs_and_padding():
    w = torch.randn(5, 3)
    packed = dense_op.pack_linear_weight(w)
    assert packed.shape == (1, 3, 16) and torch.equal(packed[0, :, 5:], torch.zeros(3, 11))
    assert dense_op.packed_linear(torch.zeros(0, 3), packed, 5).shape == (0, 5)


@pytest.mark.parametrize(("args", "message"), [
    ((torch.ones(2, 8, dtype=torch.float64), "pack", 4, None), "float32 CPU"),
    ((torch.ones(2, 7), "pack", 4, None), "are not"),
    ((torch.ones(2, 8), "pack", 40, None), "are not"),
    ((torch.ones(2, 8), "pack", 4, torch.ones(5)), "bias has 5 elements, not 4"),
])
def test_bad_arguments_are_named(args, message):
    x, _, n, bias = args
    packed = dense_op.pack_linear_weight(torch.ones(4, 8))
    with pytest.raises(RuntimeError, match=message):
        dense_op.packed_linear(x, packed, n, bias)
