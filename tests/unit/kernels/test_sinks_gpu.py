"""The 2026 attention kinds on a real GPU: sliding windows and attention sinks through the CUDA op, the compiled
Triton kernel and FlexAttention's compiled kernel, against the fp32 reference, at the heads of gpt-oss (64 query / 8
KV x 64: a 128-token window, sinks) and Gemma 3 (32 / 16 x 128: a 1024-token window), with contexts past the windows
and past split-K's partitions. The CPU runs the same checks through the C++ kernel, the interpreter and the emulator
(test_*_window.py, test_*_sinks.py); these run in the GPU check's first step (``-m gpu``)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.sink_cases import check_sink_decode
from tests.helpers.window_cases import check_window_decode

pytestmark = pytest.mark.gpu

LENS = [1, 127, 128, 129, 1023, 1025, 4097, 6000]  # either side of both windows, and long enough to split
HEADS = {"gpt-oss": (8, 8, 64), "gemma3": (16, 2, 128)}  # (kv_heads, group, head_dim)


def _on_cuda(kernel):
    """``kernel`` run on the GPU with the CPU test's arguments, its result copied into the CPU ``out``."""
    def run(q, k_cache, v_cache, tables, lens, scale, out=None, **options):
        moved = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in options.items()}
        got = kernel(q.cuda(), k_cache.cuda(), v_cache.cuda(), tables.cuda(), lens.cuda(), scale, **moved)
        torch.cuda.synchronize()
        return out.copy_(got.cpu()) if out is not None else got.cpu()

    return run


def _kernels():
    from kvbench.kernels.cuda_op import paged_decode_attention_cuda
    from kvbench.kernels.flex import flex_decode
    from kvbench.kernels.triton_paged import paged_decode_attention_triton

    return {"cuda": paged_decode_attention_cuda, "triton": paged_decode_attention_triton,
            "flex": lambda *a, **k: flex_decode(*a, mode="compiled", **k)}


@pytest.mark.parametrize("kernel", ["cuda", "triton", "flex"])
@pytest.mark.parametrize("model,window", [("gpt-oss", 128), ("gemma3", 1024)])
@pytest.mark.parametrize("block_size", [16, 128])
def test_windows_on_the_gpu(kernel, model, window, block_size):
    if kernel == "cuda":
        from kvbench.kernels import cuda_op

        cuda_op.load_op()
    kv_heads, group, head_dim = HEADS[model]
    check_window_decode(_on_cuda(_kernels()[kernel]), LENS, window, kv_heads, group, head_dim, block_size,
                        torch.bfloat16)


@pytest.mark.parametrize("kernel", ["cuda", "triton", "flex"])
@pytest.mark.parametrize("window", [0, 128])
def test_sinks_on_the_gpu(kernel, window):
    if kernel == "cuda":
        from kvbench.kernels import cuda_op

        cuda_op.load_op()
    kv_heads, group, head_dim = HEADS["gpt-oss"]
    check_sink_decode(_on_cuda(_kernels()[kernel]), LENS, window, kv_heads, group, head_dim, 16, torch.bfloat16)
