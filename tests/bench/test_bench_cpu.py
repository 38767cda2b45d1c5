"""pytest-benchmark suite (`make bench`): decode attention and bookkeeping on CPU.

Under `make test` these run once each as plain tests (--benchmark-disable);
`make bench` times them. Figures, not assertions: nothing here checks a speed.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from kvbench.impls.block_manager import BlockManager
from kvbench.kernels.reference import paged_decode_attention_ref

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
    from kvbench.kernels.cuda_op import paged_decode_attention_cuda

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


# ------------------------------------------------------------ decode next to transformers' generate (and vLLM)
# The same random-weight checkpoint (tests/helpers/checkpoints.py) and fixed-length prompts for every
# contender; each benchmark's extra_info carries output tok/s and whether its tokens equal generate's.
# Full-size comparisons: python -m tests.bench.cpu_vs_hf_generate and tests.bench.vllm_cpu_ratio.
E2E_BATCH, E2E_PROMPT, E2E_NEW = 8, 32, 16


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    from tests.bench import cpu_vs_hf_generate as hfbench
    from tests.helpers.checkpoints import write_llama_checkpoint

    folder = write_llama_checkpoint(tmp_path_factory.mktemp("ckpt"), "tiny-llama")
    prompts = torch.randint(0, 4096, (E2E_BATCH, E2E_PROMPT), generator=torch.Generator().manual_seed(0))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    hf = hfbench.hf_runner(folder, prompts, E2E_NEW)
    yield folder, prompts, hf, hf()[2]
    torch.set_num_threads(threads)


def _tok_s(benchmark, wall: float) -> None:
    benchmark.extra_info["output_tok_s"] = round(E2E_BATCH * E2E_NEW / wall, 1)


def test_bench_hf_generate(benchmark, e2e):
    _, _, hf, _ = e2e
    wall, _, _ = benchmark.pedantic(hf, rounds=3, iterations=1)
    _tok_s(benchmark, wall)


@pytest.mark.parametrize("impl", ["contiguous", "paged_torch", "paged_cuda"])
def test_bench_decode_next_to_hf_generate(benchmark, e2e, impl):
    from tests.bench import cpu_vs_hf_generate as hfbench

    folder, prompts, _, hf_tokens = e2e
    run = hfbench.engine_runner(impl, folder, prompts, E2E_NEW)
    result = benchmark.pedantic(run, rounds=3, iterations=1)
    _tok_s(benchmark, result.elapsed_s)
    same = [s.output_ids for s in result.sequences] == hf_tokens
    benchmark.extra_info["same_tokens_as_hf"] = same
    assert same


def test_bench_vllm_cpu_generate(benchmark, e2e, tmp_path):
    """vLLM's CPU engine on the same checkpoint and prompts, where a Python with vLLM is given
    (KVBENCH_VLLM_PYTHON); skipped otherwise. vLLM runs in that Python, never imported here."""
    import json

    from tests.bench.vllm_cpu_ratio import VllmProcess, vllm_python

    python = vllm_python(None)
    if python is None:
        pytest.skip("no vLLM: set KVBENCH_VLLM_PYTHON to a Python that imports vllm (e.g. a venv with vllm-cpu)")
    folder, prompts, _, hf_tokens = e2e
    prompts_file = tmp_path / "prompts.json"
    prompts_file.write_text(json.dumps(prompts.tolist()))
    vllm = VllmProcess(python, folder, prompts_file, E2E_BATCH, E2E_NEW, 32, tmp_path / "vllm.log")
    try:
        result = benchmark.pedantic(vllm.run, rounds=3, iterations=1)
    finally:
        vllm.close()
    _tok_s(benchmark, result["wall_s"])
    benchmark.extra_info["same_tokens_as_hf"] = result["tokens"] == hf_tokens
    benchmark.extra_info["startup_s"] = round(vllm.startup_s, 1)
