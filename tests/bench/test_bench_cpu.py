"""pytest-benchmark suite (`make bench`): decode attention and bookkeeping on CPU.

Under `make test` these run once each as plain tests (--benchmark-disable);
`make bench` times them. Figures, not assertions: nothing here checks a speed.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from impls.block_manager import BlockManager
from kernels.reference import paged_decode_attention_ref

BATCH, CONTEXT, HEADS, KV_HEADS, HEAD_DIM, BLOCK = 16, 1024, 32, 8, 128, 16


@pytest.fixture(scope="module")
def decode_inputs():
    g = torch.Generator().manual_seed(0)
    blocks = BATCH * CONTEXT // BLOCK
    k = torch.randn(blocks, BLOCK, KV_HEADS, HEAD_DIM, generator=g)
    v = torch.randn(blocks, BLOCK, KV_HEADS, HEAD_DIM, generator=g)
    q = torch.randn(BATCH, HEADS, HEAD_DIM, generator=g)
    tables = torch.randperm(blocks, generator=g).view(BATCH, -1).to(torch.int32)
    lens = torch.full((BATCH,), CONTEXT, dtype=torch.int32)
    return q, k, v, tables, lens


def test_bench_sdpa_contiguous(benchmark, decode_inputs):
    q, k, v, _, _ = decode_inputs
    kc = k.view(BATCH, CONTEXT, KV_HEADS, HEAD_DIM).transpose(1, 2)
    vc = v.view(BATCH, CONTEXT, KV_HEADS, HEAD_DIM).transpose(1, 2)
    out = benchmark(lambda: F.scaled_dot_product_attention(q.unsqueeze(2), kc, vc, enable_gqa=True))
    assert out.shape == (BATCH, HEADS, 1, HEAD_DIM)


def test_bench_paged_torch(benchmark, decode_inputs):
    q, k, v, tables, lens = decode_inputs
    out = benchmark(paged_decode_attention_ref, q, k, v, tables, lens, HEAD_DIM**-0.5)
    assert torch.isfinite(out).all()


def test_bench_paged_cuda_op_cpu_kernel(benchmark, decode_inputs):
    from kernels.cuda_op import paged_decode_attention_cuda

    q, k, v, tables, lens = decode_inputs
    out = benchmark(paged_decode_attention_cuda, q, k, v, tables, lens, HEAD_DIM**-0.5)
    ref = paged_decode_attention_ref(q, k, v, tables, lens, HEAD_DIM**-0.5)
    assert torch.allclose(out, ref, atol=1e-4)


def test_bench_block_manager_decode_steps(benchmark):
    def steps():
        rng = random.Random(0)
        bm = BlockManager(4096, 16)
        for sid in range(64):
            bm.admit(sid, bm.plan_admit([rng.randrange(1000) for _ in range(rng.randint(20, 200))]))
        for _ in range(256):
            for sid in range(64):
                bm.append(sid, [1])
        return bm

    bm = benchmark(steps)
    bm.check_invariants()
