"""The dense work of a Llama layer on a CPU as kvbench's own C++ ops, built on first use.

``torch.ops.kvbench_dense``:

- ``rms_norm``, ``add_rms_norm``, ``rope_qkv`` and ``silu_mul`` (kernels/csrc/dense_cpu.cpp): loops over
  contiguous float32 rows that the model's eager forward runs in place of torch's ~25 small ops a
  layer (harness/model/llama.py ``fuse_elementwise``); ``argmax_rows``, the greedy tokens of a step;
- ``pack_linear_weight`` and ``packed_linear`` (kernels/csrc/packed_gemm_cpu.cpp): the decode steps'
  GEMMs on weights packed once (harness/model/packed_linear.py).

Each cache's attention is untouched. Built like the paged-attention op (kernels/cuda_op.py): through
kernels/build_cache.py into a folder keyed by the source and flags, so a machine builds it once
(about 10 s). ``-ffp-contract=off``: no product and sum fused into one rounding, as in torch's ops;
``-fno-trapping-math`` lets the compiler vectorize the clamps in silu's exp (no value changes).
"""

from __future__ import annotations

import functools

import torch

from kvbench.kernels.build_cache import BuildSpec
from kvbench.kernels.cuda_op import CSRC, KernelBuildError, build_and_load, find_cxx

SOURCES = (CSRC / "dense_cpu.cpp", CSRC / "packed_gemm_cpu.cpp")
HEADERS = (CSRC / "cpu_isa.h",)  # the instruction set both sources run (a build input: build_cache)
PANEL = 16  # packed_linear's output columns per panel
CFLAGS = ("-O3", "-ffp-contract=off", "-fno-trapping-math")


def dense_spec() -> BuildSpec:
    """The library this machine builds: the C++ sources, CPU only."""
    return BuildSpec(name="kvbench_dense_cpu", sources=tuple(str(s) for s in SOURCES), extra_cflags=CFLAGS,
                     extra_cuda_cflags=(),
                     with_cuda=False, cxx=find_cxx())


@functools.cache
def load_dense_ops() -> None:
    """Build (or reuse) and load the library once per process. Raises KernelBuildError (or its
    CompilerNotFoundError) when it cannot be built."""
    build_and_load(dense_spec())
    _register_fakes()


@functools.cache
def dense_ops_unavailable() -> str | None:
    """None when the fused ops load on this machine; else why not, in one line (no compiler, a failed build)."""
    try:
        load_dense_ops()
    except KernelBuildError as err:
        return str(err).splitlines()[0]
    return None


def _register_fakes() -> None:
    """Shapes only, so a graph that meets the ops (FakeTensor, torch.compile) can trace them."""

    @torch.library.register_fake("kvbench_dense::rms_norm")
    def _norm(x, w, eps):
        return torch.empty_like(x)

    @torch.library.register_fake("kvbench_dense::add_rms_norm")
    def _add_norm(h, d, w, eps):
        return torch.empty_like(h), torch.empty_like(h)

    @torch.library.register_fake("kvbench_dense::rope_qkv")
    def _rope(qkv, cos, sin, heads, kv_heads):
        t, dim = qkv.shape[0], cos.shape[-1]
        return qkv.new_empty(t, heads, dim), qkv.new_empty(t, kv_heads, dim), qkv.new_empty(t, kv_heads, dim)

    @torch.library.register_fake("kvbench_dense::silu_mul")
    def _silu_mul(x):
        return x.new_empty(x.shape[0], x.shape[1] // 2)

    @torch.library.register_fake("kvbench_dense::argmax_rows")
    def _argmax(x):
        return x.new_empty(x.shape[0], dtype=torch.long)

    @torch.library.register_fake("kvbench_dense::pack_linear_weight")
    def _pack(w):
        return w.new_empty(-(-w.shape[0] // PANEL), w.shape[1], PANEL)

    @torch.library.register_fake("kvbench_dense::packed_linear")
    def _packed_linear(x, packed, n, bias=None):
        return x.new_empty(x.shape[0], n)


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(-1)`` for ``[T, V]`` contiguous float32 logits (the first index of a tie, or of the
    first NaN), in two vectorized passes."""
    return torch.ops.kvbench_dense.argmax_rows(logits)


def pack_linear_weight(weight: torch.Tensor) -> torch.Tensor:
    """A linear's ``[N, K]`` weight as packed_linear reads it: ``[ceil(N / 16), K, 16]`` panels of 16
    output columns (kernels/csrc/packed_gemm_cpu.cpp), the last zero-padded. Loads the library first (once
    per process): a packed weight is what every packed_linear call needs."""
    load_dense_ops()
    return torch.ops.kvbench_dense.pack_linear_weight(weight)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, n: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T + bias`` for ``x`` ``[M, K]`` (contiguous float32) and ``W`` packed by pack_linear_weight."""
    return torch.ops.kvbench_dense.packed_linear(x, packed, n, bias)


def packed_linear_isa() -> str:
    """The instruction set packed_linear runs: avx512, avx2 or portable (chosen when the library loads;
    ``KVBENCH_GEMM_ISA=avx2|portable`` asks for a narrower one)."""
    return torch.ops.kvbench_dense.packed_linear_isa()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's LlamaRMSNorm of each row of ``x`` (contiguous float32 on a CPU)."""
    return torch.ops.kvbench_dense.rms_norm(x, weight, eps)


def add_rms_norm(h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(h + delta, rms_norm(h + delta))`` in one pass."""
    return torch.ops.kvbench_dense.add_rms_norm(h, delta, weight, eps)


def rope_qkv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int,
             kv_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fused projection's ``[T, (H + 2 KVH) D]`` -> dense q ``[T, H, D]``, k, v ``[T, KVH, D]``, q and k
    rotated by ``cos``/``sin`` ``[T, D]``."""
    return torch.ops.kvbench_dense.rope_qkv(qkv, cos, sin, heads, kv_heads)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up = [gate | up]`` ``[T, 2 I]`` -> ``[T, I]``."""
    return torch.ops.kvbench_dense.silu_mul(gate_up)
