"""The torch.ops.kvbench C++/CUDA op (kernels/cuda_op.py) against the pure-torch oracle.

On CPU this builds the op (C++ kernels only) and runs the full grid of awkward
sizes; the CUDA source is checked by compiling it with nvcc for sm_90.
The CUDA kernels themselves run only in the ``gpu`` group, on a CUDA machine.
"""

from __future__ import annotations

import itertools
import os
import subprocess
from pathlib import Path

import pytest
import torch

from kvbench.kernels import cuda_op
from kvbench.kernels.cuda_op import (
    CompilerNotFoundError,
    KernelBuildError,
    paged_decode_attention_cuda,
    write_kv_cuda,
)
from kvbench.kernels.validate import KernelArgumentError
from tests.helpers.kernel_cases import (
    MIXED_LENS,
    assert_close_for_dtype,
    check_decode,
    check_write,
    make_decode_inputs,
    reference_decode,
)

LONG_LENS = [1, 17, 511, 512, 513, 1500, 4097, 5000]  # split-K: several partitions, ragged ends


def needs_nvcc(test):
    """Marked ``nvcc`` (the GPU check selects them) and skipped where no nvcc is found."""
    skip = pytest.mark.skipif(not cuda_op.nvcc_available(), reason="nvcc not found (PATH or CUDA_HOME)")
    return pytest.mark.nvcc(skip(test))


@pytest.fixture(scope="module")
def op() -> Path:
    """Build (first run: ~15 s) or reuse the op library."""
    return cuda_op.load_op()


# --- CPU kernels ---------------------------------------------------------------------------


@pytest.mark.parametrize("head_dim", [64, 80, 128])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("block_size", [1, 8, 16, 32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_decode_matches_reference(op, dtype, block_size, group, head_dim):
    check_decode(paged_decode_attention_cuda, MIXED_LENS, 2, group, head_dim, block_size, dtype)


@pytest.mark.parametrize("head_dim", [96, 256])
def test_decode_other_head_dims_and_long_context(op, head_dim):
    check_decode(paged_decode_attention_cuda, [3, 700, 1300], 2, 4, head_dim, 16, torch.float32)


def test_decode_strided_q_and_small_batch(op):
    """q as a view of a fused qkv tensor (not contiguous); a small batch splits the kv heads over tasks."""
    q, k_cache, v_cache, tables, lens = make_decode_inputs([97, 30], 4, 2, 64, 8, torch.float32)
    qkv = torch.randn(2, 3 * q.shape[1], 64)
    qkv[:, : q.shape[1]] = q
    strided_q = qkv[:, : q.shape[1]]
    assert not strided_q.is_contiguous()
    got = paged_decode_attention_cuda(strided_q, k_cache, v_cache, tables, lens, 0.125)
    assert_close_for_dtype(got, reference_decode(q, k_cache, v_cache, tables, lens, 0.125), torch.float32)


@pytest.mark.parametrize("block_size", [1, 8, 16, 32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_write_kv_matches_reference(op, dtype, block_size):
    check_write(write_kv_cuda, 37, 2, 64, block_size, dtype)


def test_opcheck_cpu(op):
    q, k_cache, v_cache, tables, lens = make_decode_inputs(MIXED_LENS, 2, 4, 64, 16, torch.float32)
    torch.library.opcheck(torch.ops.kvbench.paged_decode_attention.default, (q, k_cache, v_cache, tables, lens, 0.125))
    out = torch.empty_like(q)
    torch.library.opcheck(torch.ops.kvbench.paged_decode_attention_out.default,
                          (q, k_cache, v_cache, tables, lens, 0.125, out))
    key, value = torch.randn(2, 5, 2, 64).unbind(0)
    slots = torch.tensor([3, -1, 40, 7, 0])
    torch.library.opcheck(torch.ops.kvbench.write_kv.default, (key, value, k_cache.clone(), v_cache.clone(), slots))


def test_out_variant_fills_a_strided_out_in_place(op):
    q, k_cache, v_cache, tables, lens = make_decode_inputs(MIXED_LENS, 2, 4, 64, 16, torch.bfloat16)
    big = torch.full((len(MIXED_LENS), 2 * q.shape[1], 64), float("nan"), dtype=q.dtype)
    out = big[:, ::2]  # heads strided: the kernel must honour out's strides
    got = paged_decode_attention_cuda(q, k_cache, v_cache, tables, lens, 0.125, out=out)
    assert got is out and got.data_ptr() == big.data_ptr()
    assert torch.isnan(big[:, 1::2]).all(), "wrote outside out"
    assert_close_for_dtype(out, reference_decode(q, k_cache, v_cache, tables, lens, 0.125), torch.bfloat16)
    with pytest.raises(RuntimeError, match="out must have q's shape"):
        torch.ops.kvbench.paged_decode_attention_out(q, k_cache, v_cache, tables, lens, 0.125, out[:2])


def write_then_attend(q, key, value, k_cache, v_cache, slots, tables, lens):
    """One decode step through the Python wrappers (argument checks, then torch.ops.kvbench)."""
    write_kv_cuda(key, value, k_cache, v_cache, slots)
    return paged_decode_attention_cuda(q, k_cache, v_cache, tables, lens, 0.125)


def test_torch_compile_fullgraph_matches_eager(op):
    q, k_cache, v_cache, tables, lens = make_decode_inputs(MIXED_LENS, 2, 4, 64, 16, torch.float32)
    key, value = torch.randn(2, len(MIXED_LENS), 2, 64).unbind(0)
    # Each sequence's newest token: the last slot of its context.
    slots = torch.stack([tables[b, (n - 1) // 16].long() * 16 + (n - 1) % 16 for b, n in enumerate(MIXED_LENS)])
    eager_k, eager_v = k_cache.clone(), v_cache.clone()
    want = write_then_attend(q, key, value, eager_k, eager_v, slots, tables, lens)
    torch._dynamo.reset()
    compiled = torch.compile(write_then_attend, fullgraph=True)
    got = compiled(q, key, value, k_cache, v_cache, slots, tables, lens)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    assert torch.equal(k_cache, eager_k) and torch.equal(v_cache, eager_v), "the cache writes were lost"


def test_op_rejects_bad_block_ids_and_lengths(op):
    """The C++ op checks what the Python validator cannot see without reading tensors."""
    q, k_cache, v_cache, tables, lens = make_decode_inputs([20, 9], 1, 1, 64, 8, torch.float32)
    bad_tables = tables.clone()
    bad_tables[1, 0] = k_cache.shape[0]
    with pytest.raises(RuntimeError, match="block_tables"):
        torch.ops.kvbench.paged_decode_attention(q, k_cache, v_cache, bad_tables, lens, 1.0)
    too_long = torch.tensor([20, tables.shape[1] * 8 + 1], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="context_lens"):
        torch.ops.kvbench.paged_decode_attention(q, k_cache, v_cache, tables, too_long, 1.0)
    key = torch.randn(1, 1, 64)
    with pytest.raises(RuntimeError, match="slot_mapping"):
        torch.ops.kvbench.write_kv(key, key, k_cache, v_cache, torch.tensor([k_cache.shape[0] * 8]))


def _decode_args(**override):
    q, k_cache, v_cache, tables, lens = make_decode_inputs([5, 9], 2, 2, 64, 8, torch.float32)
    args = dict(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=tables, context_lens=lens, scale=0.125)
    args.update({name: make(args) for name, make in override.items()})
    return args


@pytest.mark.parametrize("override", [
    {"block_tables": lambda a: a["block_tables"].long()},
    {"context_lens": lambda a: a["context_lens"].long()},
    {"q": lambda a: a["q"].half()},
    {"q": lambda a: a["q"][:, :3]},                                   # 3 heads over 2 kv heads
    {"q": lambda a: torch.randn(2, 4, 72), "k_cache": lambda a: torch.randn(9, 8, 2, 72),
     "v_cache": lambda a: torch.randn(9, 8, 2, 72)},                  # head_dim 72
    {"k_cache": lambda a: torch.randn(9, 12, 2, 64), "v_cache": lambda a: torch.randn(9, 12, 2, 64)},
    {"out": lambda a: torch.empty(2, 4, 32)},
], ids=["tables-int64", "lens-int64", "q-dtype", "heads", "head-dim", "block-size", "out-shape"])
def test_decode_wrapper_rejects_bad_args(override):
    with pytest.raises(KernelArgumentError):
        paged_decode_attention_cuda(**_decode_args(**override))


def test_write_wrapper_rejects_bad_args():
    k_cache = torch.randn(4, 8, 2, 64)
    key = torch.randn(3, 2, 64)
    with pytest.raises(KernelArgumentError, match="int64"):
        write_kv_cuda(key, key, k_cache, k_cache.clone(), torch.tensor([0, 1, 2], dtype=torch.int32))
    with pytest.raises(KernelArgumentError, match="dtype"):
        write_kv_cuda(key.half(), key.half(), k_cache, k_cache.clone(), torch.tensor([0, 1, 2]))


# --- Build machinery -----------------------------------------------------------------------


def test_missing_compiler_is_named(monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(cuda_op.shutil, "which", lambda name: None)
    with pytest.raises(CompilerNotFoundError, match=r"no C\+\+ compiler found \(tried c\+\+, g\+\+\)") as err:
        cuda_op.find_cxx()
    assert isinstance(err.value, RuntimeError)


def test_build_dir_follows_env_and_torch_version(monkeypatch, tmp_path):
    monkeypatch.setenv("KVBENCH_BUILD_DIR", str(tmp_path))
    assert cuda_op.build_dir() == tmp_path
    monkeypatch.delenv("KVBENCH_BUILD_DIR")
    assert torch.__version__.split("+")[0] in cuda_op.build_dir().name


def test_every_csrc_file_is_a_listed_build_input():
    """A build (and its cache key) covers the sources and the headers they include: this op's, and the
    dense work's (kernels/dense_op.py)."""
    from kvbench.kernels import dense_op

    listed = {*cuda_op.CPU_SOURCES, cuda_op.CUDA_SOURCE, *cuda_op.HEADERS, cuda_op.EMULATED_SOURCE, *dense_op.SOURCES,
              *dense_op.HEADERS}
    assert set(cuda_op.CSRC.iterdir()) == listed


@needs_nvcc
def test_cuda_source_compiles():
    """For sm_90 (the H200's), assembled at ptxas -O0: every kernel generated and fitted to the arch, in
    about 3 minutes here instead of -O3's 4-5 (the GPU check builds the op at -O3 on the GPU's own arch).
    nvcc runs when the .cu, a header, nvcc or the flags changed since its last success on this machine
    (``checked_cuda_object``); identical inputs reuse that outcome."""
    obj, _ = cuda_op.checked_cuda_object("sm_90", ptxas_level=0)
    assert obj.is_file() and obj.stat().st_size > 0


def test_the_cuda_check_reruns_nvcc_when_any_input_changes(tmp_path):
    """The key of a kept CUDA check covers every byte of the .cu and each header, nvcc's version and flags."""
    from kvbench.kernels import dense_op

    # every header beside the .cu is a build input (build_cache), the dense ops' too
    sources = (cuda_op.CUDA_SOURCE, *cuda_op.HEADERS, *dense_op.HEADERS)
    inputs = [tmp_path / p.name for p in sources]
    for src, dst in zip(sources, inputs):
        dst.write_bytes(src.read_bytes())
    copy = inputs[0]  # the .cu, its headers beside it
    base = cuda_op.cuda_check_key("sm_90", 0, "nvcc 12.8", copy)
    assert base == cuda_op.cuda_check_key("sm_90", 0, "nvcc 12.8", cuda_op.CUDA_SOURCE)
    assert len({base, cuda_op.cuda_check_key("sm_80", 0, "nvcc 12.8", copy),
                cuda_op.cuda_check_key("sm_90", 3, "nvcc 12.8", copy),
                cuda_op.cuda_check_key("sm_90", 0, "nvcc 12.9", copy)}) == 4
    for path in inputs:
        kept = path.read_bytes()
        path.write_bytes(kept + b" ")
        assert cuda_op.cuda_check_key("sm_90", 0, "nvcc 12.8", copy) != base, path.name
        path.write_bytes(kept)


@needs_nvcc
def test_nvcc_errors_are_reported(tmp_path):
    with pytest.raises(KernelBuildError, match="nvcc"):
        cuda_op.compile_cuda_source("sm_1", tmp_path)


@needs_nvcc
def test_cuda_registration_compiles_against_torch_headers(tmp_path):
    """ops.cpp's CUDA half (KVBENCH_WITH_CUDA), syntax-checked against torch's c10/cuda headers."""
    from torch.utils.cpp_extension import include_paths

    from torch.utils.cpp_extension import CUDA_HOME

    homes = [CUDA_HOME, os.environ.get("CUDA_HOME"), Path(cuda_op.find_nvcc()).resolve().parent.parent, "/usr/local/cuda"]
    cuda_include = next((Path(h, "include") for h in homes if h and Path(h, "include/cuda_runtime_api.h").is_file()), None)
    if cuda_include is None or not Path(include_paths()[0], "c10/cuda/CUDAStream.h").is_file():
        pytest.skip("CUDA runtime headers or torch's c10/cuda headers missing")
    cmd = [cuda_op.find_cxx(), "-std=c++17", "-fsyntax-only", "-DKVBENCH_WITH_CUDA",
           # CPU wheels ship c10/cuda headers without the generated cmake macros file.
           "-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE",
           *(f"-isystem{p}" for p in include_paths()), f"-isystem{cuda_include}", str(cuda_op.CSRC / "ops.cpp")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# --- CUDA kernels (a GPU machine) -----------------------------------------------------------


GPU_DECODE_CASES = list(itertools.product(
    [torch.float32, torch.float16, torch.bfloat16],
    [1, 16, 128],           # block sizes
    [(2, 1), (2, 4), (1, 8), (2, 6), (1, 16)],  # (kv_heads, group): head tiles of 8 and their remainders
    [64, 80, 96, 128, 256],
))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,block_size,heads,head_dim", GPU_DECODE_CASES, ids=str)
def test_cuda_decode_matches_reference(op, dtype, block_size, heads, head_dim):
    kv_heads, group = heads
    for lens in (MIXED_LENS, LONG_LENS):  # one partition, then split-K
        check_decode(paged_decode_attention_cuda, lens, kv_heads, group, head_dim, block_size, dtype, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_cuda_matches_cpu_kernel(op, dtype):
    inputs = make_decode_inputs(LONG_LENS, 2, 4, 128, 16, dtype)
    cpu = paged_decode_attention_cuda(*inputs, 0.1)
    gpu = paged_decode_attention_cuda(*(t.cuda() for t in inputs), 0.1)
    assert_close_for_dtype(gpu.cpu(), cpu, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("misaligned", [False, True], ids=["vectorised", "scalar"])
@pytest.mark.parametrize("block_size", [1, 16, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_cuda_write_kv_matches_reference(op, dtype, block_size, misaligned):
    check_write(write_kv_cuda, 300, 2, 128, block_size, dtype, device="cuda", misaligned=misaligned)


@pytest.mark.gpu
def test_opcheck_cuda(op):
    q, k_cache, v_cache, tables, lens = make_decode_inputs(LONG_LENS, 2, 4, 128, 16, torch.float16, device="cuda")
    torch.library.opcheck(torch.ops.kvbench.paged_decode_attention.default, (q, k_cache, v_cache, tables, lens, 0.1))
    torch.library.opcheck(torch.ops.kvbench.paged_decode_attention_out.default,
                          (q, k_cache, v_cache, tables, lens, 0.1, torch.empty_like(q)))
    key, value = torch.randn(2, 5, 2, 128, device="cuda", dtype=torch.float16).unbind(0)
    slots = torch.tensor([3, -1, 40, 7, 0], device="cuda")
    torch.library.opcheck(torch.ops.kvbench.write_kv.default, (key, value, k_cache.clone(), v_cache.clone(), slots))


@pytest.mark.gpu
def test_cuda_torch_compile_matches_eager(op):
    q, k_cache, v_cache, tables, lens = make_decode_inputs(MIXED_LENS, 2, 4, 64, 16, torch.float32, device="cuda")
    key, value = torch.randn(2, len(MIXED_LENS), 2, 64, device="cuda").unbind(0)
    slots = torch.arange(len(MIXED_LENS), device="cuda") * 3
    eager_k, eager_v = k_cache.clone(), v_cache.clone()
    want = write_then_attend(q, key, value, eager_k, eager_v, slots, tables, lens)
    torch._dynamo.reset()
    got = torch.compile(write_then_attend, fullgraph=True)(q, key, value, k_cache, v_cache, slots, tables, lens)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(k_cache, eager_k)
