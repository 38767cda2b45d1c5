"""Pre-packed GEMMs for a CPU's decode steps (LlamaModel.prepack): a weight reordered once, as a CPU
serving engine does, so each step streams it in the layout its kernel reads.

Two kernels, one chosen per model when it is packed (``pack_kind``):

- ``kvbench``: kernels/csrc/packed_gemm_cpu.cpp (kernels/dense_op.py), 16-column panels streamed with
  prefetch, for 1-64 rows. Measured on a 2-core AMD EPYC (Zen 4), fp32, one thread, a 58M Llama's
  GEMMs a step (tests/bench/cpu_gemm_step.py): 6.6 ms at 1 row (MKL's GEMV 15 ms), 11.0 ms at 8 rows
  (oneDNN 13.1, vLLM's oneDNN matmul 11.8), about even with oneDNN at 32 rows, 5% slower at 64.
- ``onednn``: oneDNN's inner product on its own blocked layout, for 2-64 rows, where the op library
  cannot be built (no C++ compiler): 1.0-1.4x F.linear at 2-64 rows, 2x on a large lm_head.

Outside those rows (prefill) F.linear (MKL's sgemm) runs: faster there. A compiled graph traces
F.linear too; inductor's freezing packs its weights itself.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvbench.kernels import dense_op

PACKED_MAX_ROWS = 64
# The fewest rows each kernel runs: oneDNN's inner product lost to MKL's GEMV at one row.
MIN_ROWS = {"kvbench": 1, "onednn": 2}
# The rows' ``linear_backend`` for each.
BACKEND_NAMES = {"kvbench": "kvbench_packed", "onednn": "onednn_packed"}


def prepack_supported(device: torch.device | str, dtype: torch.dtype) -> bool:
    """Whether LlamaModel.prepack applies: float32 on a CPU whose torch has oneDNN (mkldnn)."""
    return (torch.device(device).type == "cpu" and dtype == torch.float32
            and torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled)


def pack_kind() -> str:
    """The kernel a model packs for: kvbench's own where its op library loads, else oneDNN's."""
    return "kvbench" if dense_op.dense_ops_unavailable() is None else "onednn"


class PackedWeight:
    """A weight packed once for ``kind``'s kernel, repacked if the weight changed in place.

    Not a parameter or buffer: state_dict, parameters() and the weight bytes the rows report are
    the plain weight's. The packed copy is a second copy of the weight in host memory.
    """

    def __init__(self, weight: torch.Tensor, kind: str = "onednn") -> None:
        if kind not in MIN_ROWS:
            raise ValueError(f"unknown packed GEMM kind {kind!r}; choose one of {sorted(MIN_ROWS)}")
        self.weight, self.kind, self.min_rows = weight, kind, MIN_ROWS[kind]
        self._pack()

    def _pack(self) -> None:
        self.version = self.weight._version
        w = self.weight.detach()
        self.packed = (dense_op.pack_linear_weight(w.contiguous()) if self.kind == "kvbench"
                       else torch.ops.mkldnn._reorder_linear_weight(w, None))

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.weight._version != self.version:  # loaded or edited in place after packing
            self._pack()
        if self.kind == "kvbench":
            return dense_op.packed_linear(x.contiguous(), self.packed, self.weight.shape[0], bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, packed: PackedWeight | None) -> torch.Tensor:
    """``F.linear``, or the packed GEMM for decode-sized row counts (eager only: a compiled graph traces
    F.linear, and inductor's freezing packs its weights itself)."""
    if (packed is not None and not torch.compiler.is_compiling() and x.dim() == 2
            and packed.min_rows <= x.shape[0] <= PACKED_MAX_ROWS):
        return packed.linear(x, bias)
    return F.linear(x, weight, bias)
