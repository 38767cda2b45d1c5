"""The CUDA op's own code, run on the CPU: its GPU path checked where there is no GPU.

``torch.ops.kvbench_emu`` is ops.cpp's CUDA path (checks, workspace sizing, launcher
arguments) registered for CPU tensors, over paged_attention.cu compiled by the host
compiler against a CPU emulator of the CUDA it uses (kernels/csrc/cuda_emulation.h:
a block's threads are OS threads, barriers and warp shuffles are real, launches are
checked against an H100/H200's limits). The same kernels and launchers that run on a GPU
run here, so the tests compare them with the torch reference on every machine.

It is a kernel module (``decode`` / ``write`` with the reference's signatures), so a run
can use it too: ``+impl=paged_cuda impl.kernel=kernels.cuda_emulated`` — slow (thousands
of thread barriers per block), for small shapes only. Its figures are not GPU figures.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from kvbench.kernels.build_cache import BuildSpec
from kvbench.kernels.cuda_op import CSRC, CUDA_SOURCE, EMULATED_SOURCE, build_and_load, find_cxx
from kvbench.kernels.quant import KVScales
from kvbench.kernels.sinks import check_sinks
from kvbench.kernels.validate import QUANTIZED_DTYPES, check_decode_args, check_write_args

SOURCES = (CSRC / "ops.cpp", EMULATED_SOURCE)
# -fno-strict-aliasing: the kernels reinterpret 16-byte loads as halves, as CUDA allows.
# -fvisibility=hidden: the emulated launchers carry the real ones' extern "C" names; hidden,
# neither library can bind to the other's if both load in one process (a GPU machine).
CFLAGS = ("-O2", "-DKVBENCH_CUDA_EMULATION", "-fno-strict-aliasing", "-Wno-unknown-pragmas", "-fvisibility=hidden")


def emulated_spec() -> BuildSpec:
    return BuildSpec(name="kvbench_ops_emulated", sources=tuple(str(s) for s in SOURCES), extra_cflags=CFLAGS,
                     extra_cuda_cflags=(), with_cuda=False, cxx=find_cxx(), includes=(str(CUDA_SOURCE),))


@functools.cache
def load() -> Path:
    """Build (or reuse) and load the emulated op once per process; returns its path."""
    return build_and_load(emulated_spec())


def decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
           context_lens: torch.Tensor, scale: float, out: torch.Tensor | None = None, *,
           scales: KVScales | None = None, window: int = 0, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Decode attention by the CUDA kernels, emulated; fills ``out`` if given (kernels/reference.py).
    A quantized cache comes with its ``scales`` (kernels/quant.py), as for the real op; ``window`` > 0 is a
    sliding window in tokens and ``sinks`` float32 ``[heads]`` attention sinks (kernel arguments; the registry
    passes a plugin neither, so runs use them only through the tests)."""
    check_decode_args(q, k_cache, v_cache, block_tables, context_lens, out, scales=scales, quantized=QUANTIZED_DTYPES,
                      window=window)
    check_sinks(sinks, q.shape[1], q.device)
    load()
    extra = () if scales is None else (scales.k, scales.v)
    if out is None:
        return torch.ops.kvbench_emu.paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens,
                                                            float(scale), *extra, window=window, sinks=sinks)
    torch.ops.kvbench_emu.paged_decode_attention_out(q, k_cache, v_cache, block_tables, context_lens, float(scale),
                                                     out, *extra, window=window, sinks=sinks)
    return out


def write(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
          slot_mapping: torch.Tensor, *, scales: KVScales | None = None) -> None:
    """Store key/value rows into their slots by the CUDA write kernel, emulated; slot < 0 is skipped.
    A quantized cache (``scales``) is written by the CUDA quantizing write kernel, as the real op does."""
    check_write_args(key, value, k_cache, v_cache, slot_mapping, scales=scales, quantized=QUANTIZED_DTYPES)
    load()
    if scales is None:
        torch.ops.kvbench_emu.write_kv(key, value, k_cache, v_cache, slot_mapping)
    else:
        torch.ops.kvbench_emu.write_kv_quant(key, value, k_cache, v_cache, slot_mapping, scales.k, scales.v)
