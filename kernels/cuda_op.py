"""The kvbench C++/CUDA paged-attention op: built on first use, called through torch.ops.

``torch.ops.kvbench.paged_decode_attention``, ``torch.ops.kvbench.write_kv`` and, for a
quantized cache, ``torch.ops.kvbench.write_kv_quant`` have a C++ CPU kernel always and a
CUDA kernel when torch itself has CUDA and a GPU is visible (sources in kernels/csrc). The build goes through
``torch.utils.cpp_extension.load`` into a cache folder keyed by its sources and flags
(kernels/build_cache.py: stale locks cleared, a time limit), so only the first call
in a fresh environment pays for the compile.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from kvbench.kernels.build_cache import BuildError, BuildSpec, build_key, build_timeout_s, ensure_built
from kvbench.kernels.quant import KVScales
from kvbench.kernels.sinks import check_sinks
from kvbench.kernels.validate import QUANTIZED_DTYPES, check_decode_args, check_write_args

CSRC = Path(__file__).resolve().parent / "csrc"
CPU_SOURCES = (CSRC / "ops.cpp", CSRC / "paged_attention_cpu.cpp", CSRC / "kv_write_cpu.cpp")
CUDA_SOURCE = CSRC / "paged_attention.cu"
# Headers the sources include: never compiled alone, yet a change to one must rebuild.
# paged_attention.cu's parts (*.cuh: its device basics, decode kernels and writes) are in its one translation unit.
HEADERS = (CSRC / "paged_attention.h", CSRC / "cuda_compat.h", CSRC / "cuda_emulation.h", CSRC / "kv_quant.h",
           CSRC / "paged_attention_common.cuh", CSRC / "paged_attention_decode.cuh", CSRC / "paged_attention_write.cuh")
# The CPU emulator's build of the CUDA source (kernels/cuda_emulated.py): ops.cpp plus this.
EMULATED_SOURCE = CSRC / "paged_attention_emulated.cpp"
CXX_CANDIDATES = ("c++", "g++")


class KernelBuildError(RuntimeError):
    """The C++/CUDA op could not be built."""


class CompilerNotFoundError(KernelBuildError):
    """No C++ compiler (or, for the CUDA build, no nvcc) to build the op with."""


def cuda_build_wanted() -> bool:
    """Build the CUDA kernels too: only when this torch has CUDA and sees a GPU."""
    return torch.version.cuda is not None and torch.cuda.is_available()


def build_dir() -> Path:
    """Where builds are cached (one subfolder per build key): $KVBENCH_BUILD_DIR, else one folder
    per Python + torch version."""
    if env := os.environ.get("KVBENCH_BUILD_DIR"):
        return Path(env).expanduser()
    tag = re.sub(r"[^A-Za-z0-9._-]", "_", f"py{sys.version_info.major}{sys.version_info.minor}-torch{torch.__version__}")
    return Path.home() / ".cache" / "kvbench" / "torch_extensions" / tag


def find_cxx() -> str:
    """The C++ compiler to build with: $CXX if set, else the first of c++, g++ on the PATH."""
    if cxx := os.environ.get("CXX"):
        if shutil.which(cxx):
            return cxx
        raise CompilerNotFoundError(f"CXX={cxx!r} is not an executable on the PATH — install it or unset CXX")
    for name in CXX_CANDIDATES:
        if shutil.which(name):
            return name
    raise CompilerNotFoundError(
        f"no C++ compiler found (tried {', '.join(CXX_CANDIDATES)}) — install g++ or set CXX"
    )


def find_nvcc() -> str | None:
    """nvcc on the PATH, else under torch's idea of CUDA_HOME; None when there is none."""
    if found := shutil.which("nvcc"):
        return found
    from torch.utils.cpp_extension import CUDA_HOME

    candidate = Path(CUDA_HOME, "bin", "nvcc") if CUDA_HOME else None
    return str(candidate) if candidate and candidate.is_file() else None


def nvcc_available() -> bool:
    return find_nvcc() is not None


def _cuda_arch_flags() -> list[str]:
    """TORCH_CUDA_ARCH_LIST when set (cpp_extension reads it); else the visible GPU's arch."""
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return []
    major, minor = torch.cuda.get_device_capability()
    return [f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}"]


def op_spec() -> BuildSpec:
    """What this machine builds: the C++ CPU kernels, plus the CUDA ones when torch has CUDA and a GPU."""
    with_cuda = cuda_build_wanted()
    cxx = find_cxx()
    sources = [str(s) for s in CPU_SOURCES]
    cflags, cuda_cflags = ["-O3"], []
    if with_cuda:
        if not nvcc_available():
            raise CompilerNotFoundError(
                f"torch {torch.__version__} has CUDA {torch.version.cuda} but no nvcc was found "
                "(PATH, CUDA_HOME) — install the CUDA toolkit or set CUDA_HOME"
            )
        sources.append(str(CUDA_SOURCE))
        cflags = ["-O3", "-DKVBENCH_WITH_CUDA"]
        cuda_cflags = ["-O3", *_cuda_arch_flags()]
    return BuildSpec(name="kvbench_ops_cuda" if with_cuda else "kvbench_ops_cpu", sources=tuple(sources),
                     extra_cflags=tuple(cflags), extra_cuda_cflags=tuple(cuda_cflags), with_cuda=with_cuda, cxx=cxx)


def build_and_load(spec: BuildSpec) -> Path:
    """Build (or reuse) the op library ``spec`` describes and load its ops into torch.ops; returns its path."""
    try:
        path = ensure_built(spec, build_dir(), build_timeout_s())
    except BuildError as err:
        raise KernelBuildError(str(err)) from err
    torch.ops.load_library(str(path))
    return path


@functools.cache
def load_op() -> Path:
    """Build (or reuse) and load the op library once per process; returns its path."""
    path = build_and_load(op_spec())
    _register_fakes()
    return path


def _register_fakes() -> None:
    """Shape-only implementations so torch.compile and FakeTensor can trace the ops."""

    @torch.library.register_fake("kvbench::paged_decode_attention")
    def _decode_fake(q, k_cache, v_cache, block_tables, context_lens, scale, k_scale=None, v_scale=None, window=0,
                     sinks=None):
        return q.new_empty(q.shape)

    @torch.library.register_fake("kvbench::paged_decode_attention_out")
    def _decode_out_fake(q, k_cache, v_cache, block_tables, context_lens, scale, out, k_scale=None, v_scale=None,
                         window=0, sinks=None):
        return None

    @torch.library.register_fake("kvbench::write_kv")
    def _write_fake(key, value, k_cache, v_cache, slot_mapping):
        return None

    @torch.library.register_fake("kvbench::write_kv_quant")
    def _write_quant_fake(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale):
        return None


def _ensure_loaded() -> None:
    # torch.compile cannot trace the build (file-system calls); the op must already be
    # loaded by then: any eager call, or load_op(), does it.
    if not torch.compiler.is_compiling():
        load_op()


def paged_decode_attention_cuda(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    *,
    validate: bool = True,
    scales: KVScales | None = None,
    window: int = 0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode attention over the paged cache (kernels/reference.py); fills ``out`` if given.

    ``window`` > 0 (a sliding-window layer's, in tokens) masks keys before ``context_len - window``; the
    kernels skip the blocks before the window's first key. 0: the full-attention call, unchanged.
    ``sinks`` (float32 ``[heads]``, kernels/sinks.py) join every head's softmax; None: the call as without them.

    A quantized cache (fp8 / int8 stores, kernels/quant.py) comes with its ``scales``; the
    kernels read its bytes as they are and dequantize them in registers.
    ``validate=False`` skips the argument checks: for a caller that already checked
    tensors of these shapes (a KV cache checks the first layer of a step).
    """
    if validate:
        check_decode_args(q, k_cache, v_cache, block_tables, context_lens, out,
                          scales=scales, quantized=QUANTIZED_DTYPES, window=window)
        check_sinks(sinks, q.shape[1], q.device)
    _ensure_loaded()
    if window > 0 or sinks is not None:
        extra = () if scales is None else (scales.k, scales.v)
        if out is None:
            return torch.ops.kvbench.paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens,
                                                            float(scale), *extra, window=window, sinks=sinks)
        torch.ops.kvbench.paged_decode_attention_out(q, k_cache, v_cache, block_tables, context_lens, float(scale),
                                                     out, *extra, window=window, sinks=sinks)
        return out
    if scales is None:  # the float cache's call, as before the quantized one existed
        if out is None:
            return torch.ops.kvbench.paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens,
                                                            float(scale))
        torch.ops.kvbench.paged_decode_attention_out(q, k_cache, v_cache, block_tables, context_lens, float(scale),
                                                     out)
        return out
    if out is None:
        return torch.ops.kvbench.paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, float(scale),
                                                        scales.k, scales.v)
    torch.ops.kvbench.paged_decode_attention_out(q, k_cache, v_cache, block_tables, context_lens, float(scale), out,
                                                 scales.k, scales.v)
    return out


def write_kv_cuda(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    validate: bool = True,
    scales: KVScales | None = None,
) -> None:
    """Store key/value rows ``[tokens, kv_heads, head_dim]`` into their slots; slot < 0 is skipped.

    A quantized cache (``scales``) is written by ``kvbench::write_kv_quant``: the rows are
    quantized in the kernel as kernels/quant.py does (the same bytes), with the static
    scales, or (per token and head) each row's amax scale, stored at its slot; a slot < 0
    is skipped there too, with no host sync.
    ``validate=False`` skips the argument checks, as for the decode.
    """
    if validate:
        check_write_args(key, value, k_cache, v_cache, slot_mapping, scales=scales, quantized=QUANTIZED_DTYPES)
    _ensure_loaded()
    if scales is None:
        torch.ops.kvbench.write_kv(key, value, k_cache, v_cache, slot_mapping)
    else:
        torch.ops.kvbench.write_kv_quant(key, value, k_cache, v_cache, slot_mapping, scales.k, scales.v)


def compile_cuda_source(arch: str, out_dir: str | os.PathLike, ptxas_level: int = 3) -> Path:
    """Compile paged_attention.cu alone for one GPU arch (e.g. "sm_90"): a check that needs no GPU.

    ``ptxas_level``: ptxas's optimisation level. A check may take 0: every kernel is still generated,
    assembled and fitted to the arch's resources, in a third of -O3's minutes (each cache type has
    its own kernels: about 180 instantiations)."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise CompilerNotFoundError("nvcc not found (PATH, CUDA_HOME) — install the CUDA toolkit")
    out = Path(out_dir) / f"paged_attention_{arch}.o"
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [nvcc, f"-arch={arch}", "-std=c++17", "-O3", f"-Xptxas=-O{ptxas_level}", "-c", str(CUDA_SOURCE),
           "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise KernelBuildError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr}")
    return out


def cuda_check_key(arch: str, ptxas_level: int, nvcc_version: str, source: Path = CUDA_SOURCE) -> str:
    """What decides ``compile_cuda_source``'s outcome: the op build's own key (``build_key``: the .cu and the
    headers beside it byte for byte, the flags, the compiler) with nvcc's version."""
    spec = BuildSpec(name=f"cuda-check-{arch}", sources=(str(source),), extra_cflags=(),
                     extra_cuda_cflags=(f"-arch={arch}", "-std=c++17", "-O3", f"-Xptxas=-O{ptxas_level}"),
                     with_cuda=True, cxx="nvcc")
    return hashlib.sha256(f"{build_key(spec)}\0{nvcc_version}".encode()).hexdigest()[:16]


def checked_cuda_object(arch: str, ptxas_level: int = 0) -> tuple[Path, bool]:
    """``compile_cuda_source``'s object, kept in the build folder under ``cuda_check_key``: nvcc runs only
    when the sources, nvcc or the flags changed since it last succeeded on this machine (as ccache would:
    the outcome of identical inputs is known). Returns the object and whether nvcc ran now."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise CompilerNotFoundError("nvcc not found (PATH, CUDA_HOME) — install the CUDA toolkit")
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    folder = build_dir() / f"cuda-check-{cuda_check_key(arch, ptxas_level, version)}"
    obj = folder / f"paged_attention_{arch}.o"
    if obj.is_file() and obj.stat().st_size > 0:
        return obj, False
    scratch = folder.with_name(f"{folder.name}.{os.getpid()}.tmp")
    built = compile_cuda_source(arch, scratch, ptxas_level)
    folder.mkdir(parents=True, exist_ok=True)
    os.replace(built, obj)  # whole or absent: a killed compile leaves only its scratch folder
    shutil.rmtree(scratch, ignore_errors=True)
    return obj, True
