"""The CUDA op's GPU code (ops.cpp's CUDA path, paged_attention.cu's launchers and kernels)
run on the CPU under kernels/csrc/cuda_emulation.h, against the torch reference.

The emulator runs a block's threads as OS threads with real barriers and warp shuffles,
lands each cp.async copy only when a wait needs it, fills shared memory with NaN before
each block, and checks launches against an H100/H200's limits. So a missing barrier or
wait, a read of shared memory nobody wrote, a wrong grid or a missing shared-memory
opt-in fails here, on a machine with no GPU, as it would on one. What it cannot show is
speed: that is the GPU check's kernel scenario.
"""

from __future__ import annotations

import json

import pytest
import torch

from kvbench.kernels import cuda_emulated
from kvbench.kernels.validate import KernelArgumentError
from tests.helpers.kernel_cases import MIXED_LENS, assert_close_for_dtype, check_decode, check_write, make_decode_inputs, \
    reference_decode

SPLIT_LENS = [1, 511, 512, 513, 1100]  # one partition, its edge, and split-K with a ragged end


@pytest.fixture(scope="module")
def emulated():
    """Build (first run: ~20 s) or reuse the emulated op."""
    return cuda_emulated.load()


def test_the_emulated_launchers_are_not_exported(emulated):
    """They carry the real launchers' names: hidden, neither library binds to the other's in one process."""
    import ctypes

    lib = ctypes.CDLL(str(emulated))
    for name in ("kvbench_paged_decode_attention", "kvbench_write_kv", "kvbench_paged_decode_workspace_bytes"):
        assert not hasattr(lib, name), name


# (dtype, block_size, kv_heads, group, head_dim, lens): every head dim, every dtype, block
# sizes 1-128, groups below, at and above a block's 8 query heads, both partition paths.
DECODE_CASES = [
    (torch.float32, 16, 2, 4, 128, MIXED_LENS),
    (torch.bfloat16, 16, 2, 4, 128, SPLIT_LENS),
    (torch.float16, 1, 1, 8, 64, [3, 40, 129]),
    (torch.bfloat16, 128, 1, 16, 80, [1, 130, 700]),
    (torch.float32, 8, 2, 6, 256, [5, 33, 600]),
    (torch.float16, 32, 3, 1, 96, [1, 17, 97]),
    (torch.float32, 4, 1, 12, 64, [2, 1030]),
    (torch.float32, 2, 1, 8, 256, [9, 70]),  # the largest shared memory: needs the opt-in above 48 KB
]


@pytest.mark.parametrize("dtype,block_size,kv_heads,group,head_dim,lens", DECODE_CASES, ids=str)
def test_decode_matches_reference(emulated, dtype, block_size, kv_heads, group, head_dim, lens):
    """On an emulated H200 (132 SMs) these few sequences take partitions shrunk to 128-256 tokens."""
    check_decode(cuda_emulated.decode, lens, kv_heads, group, head_dim, block_size, dtype)


@pytest.mark.parametrize("landing", ["early", "late"])
def test_cp_async_landing_early_or_late(emulated, monkeypatch, landing):
    """A copy may land any time between its issue and the wait for it: the emulator lands it
    at either end (late: the default everywhere else; early: with the warps skewed, so a copy
    started into a stage another warp still reads overwrites it), and the results must not
    change. Starting the next copy before the ring's barrier fails the early case."""
    monkeypatch.setenv("KVBENCH_EMULATED_CP_ASYNC", landing)
    check_decode(cuda_emulated.decode, [3, 300], 1, 4, 128, 16, torch.bfloat16, seed=11)


@pytest.mark.parametrize("sms", [1, 3, 40])
@pytest.mark.parametrize("block_size", [16, 128])
def test_every_partition_size(emulated, monkeypatch, sms, block_size):
    """The partition the launcher picks follows the SM count (512, 256, 128 tokens here);
    the workspace ops.cpp sizes and the launch agree on it at each."""
    monkeypatch.setenv("KVBENCH_EMULATED_SMS", str(sms))
    check_decode(cuda_emulated.decode, [3, 300, 1100], 1, 4, 64, block_size, torch.bfloat16, seed=sms)


def test_strided_q_into_a_strided_out(emulated):
    """q a slice of a fused projection, out a slice of a wider buffer: both written through strides."""
    q, k_cache, v_cache, tables, lens = make_decode_inputs([7, 300], 2, 4, 64, 16, torch.float16, seed=3)
    fused = torch.randn(2, 8, 3 * 64).half()
    fused[..., 64:128] = q
    q_view = fused[..., 64:128]
    wide = torch.full((2, 8, 2 * 64), float("nan")).half()
    out = wide[..., 64:]
    got = cuda_emulated.decode(q_view, k_cache, v_cache, tables, lens, 0.125, out=out)
    assert got is out and torch.isnan(wide[..., :64]).all(), "wrote outside out"
    assert_close_for_dtype(out, reference_decode(q, k_cache, v_cache, tables, lens, 0.125), torch.float16)


def test_empty_context_gives_zeros(emulated):
    q, k_cache, v_cache, tables, lens = make_decode_inputs([5, 600], 1, 2, 64, 16, torch.float32)
    lens[0] = 0
    out = cuda_emulated.decode(q, k_cache, v_cache, tables, lens, 0.125)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    torch.testing.assert_close(out[1], reference_decode(q, k_cache, v_cache, tables, lens, 0.125)[1])


@pytest.mark.parametrize("misaligned", [False, True], ids=["vectorised", "scalar"])
@pytest.mark.parametrize("block_size", [1, 16, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_write_matches_reference(emulated, dtype, block_size, misaligned):
    check_write(cuda_emulated.write, 40, 2, 64, block_size, dtype, misaligned=misaligned)


def test_unsupported_head_dim_is_the_launchers_error(emulated):
    """The launcher's own status reaches the caller through ops.cpp, as on a GPU."""
    q, k_cache, v_cache, tables, lens = make_decode_inputs([5], 1, 1, 48, 16, torch.float32)
    with pytest.raises((RuntimeError, KernelArgumentError), match="head_dim"):
        cuda_emulated.decode(q, k_cache, v_cache, tables, lens, 0.1)


def test_engine_with_the_emulated_cuda_kernel_generates_contiguous_tokens(compose, tmp_path):
    """paged_cuda's engine path with the CUDA kernels themselves (emulated) gives the contiguous cache's tokens."""
    from kvbench.harness.front.job import run_job

    common = ["model=tiny-llama", "dtype=float32", "max_seq_len=128", "scenario.warmup=0", "device=cpu",
              "block_size=8", "batch=2", "workload=uniform", "workload.num_requests=3", "workload.prompt_len=13",
              "workload.output_len=4"]
    runs = {}
    for name, extra in (("contiguous", ["+impl=contiguous"]),
                        ("emulated", ["+impl=paged_cuda", "impl.kernel=kernels.cuda_emulated"])):
        rows, code = run_job(compose([*extra, *common]), tmp_path / name)
        assert code == 0, rows[0].get("error")
        tokens = [json.loads(line) for line in (tmp_path / name / "tokens.jsonl").read_text().splitlines()]
        runs[name] = (rows[0], [{k: v for k, v in t.items() if k != "impl"} for t in tokens])
    assert runs["emulated"][0]["kernel_backend"] == "kernels.cuda_emulated"
    assert runs["emulated"][0]["output_digest"] == runs["contiguous"][0]["output_digest"]
    assert runs["emulated"][1] == runs["contiguous"][1]
