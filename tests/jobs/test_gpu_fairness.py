"""GPU-only checks that every impl is measured fairly and gives the same tokens.

Run by the GPU check (`.ci/gpu-check`); skipped on machines without CUDA. Runs write
into pytest's temporary folders, never into the published results/.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

ALL_IMPLS_FP32 = ["model=tiny-llama", "dtype=float32", "device=cuda", "max_seq_len=512", "scenario.warmup=1"]


@pytest.mark.parametrize("overrides", [
    ["batch=8"],
    ["batch=3", "block_size=8", "workload=shared_prefix", "workload.num_requests=7",
     "workload.prompt_len=60", "workload.shared_prefix_len=40", "workload.output_len=24"],
    ["batch=5", "block_size=1", "workload=parallel_sampling", "workload.num_requests=4",
     "workload.prompt_len=30", "workload.output_len=20"],
], ids=["chat", "shared-prefix-b8", "parallel-sampling-b1"])
def test_every_impl_generates_the_same_tokens_on_gpu(compose, tmp_path, overrides):
    from kvbench.harness.front.groups import impl_names
    from kvbench.harness.front.job import run_job

    rows, code = run_job(compose([*ALL_IMPLS_FP32, *overrides]), tmp_path / "parity")
    assert code == 0, [r.get("error") for r in rows]
    assert sorted(r["impl"] for r in rows) == sorted(impl_names())
    assert all(r["status"] == "ok" for r in rows)
    digests = {r["impl"]: r["output_digest"] for r in rows}
    assert len(set(digests.values())) == 1, digests
    backends = {r["impl"]: r["kernel_backend"] for r in rows}
    assert backends == {"contiguous": "sdpa", "paged_torch": "torch", "paged_triton": "triton", "paged_cuda": "cuda",
                        "paged_flex": "flex-compiled",
                        "orca_pow2": "sdpa+gather", "orca_oracle": "sdpa+gather"}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("dense", [True, False], ids=["dense-lanes", "gathered-lanes"])
def test_contiguous_decode_never_falls_back_to_the_math_sdpa(dtype, dense):
    """Llama-3-8B heads (32 query / 8 KV x 128): the decode call must take a fused backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kvbench.impls.contiguous import ContiguousCache
    from kvbench.impls.lane_allocator import LaneAllocator

    heads, kv_heads, head_dim, batch, max_len = 32, 8, 128, 6, 256
    alloc = LaneAllocator(batch + 2, max_len)
    cache = ContiguousCache(alloc, num_layers=1, num_heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                            dtype=dtype, device=torch.device("cuda"), bytes_per_token=1)
    seq_ids = list(range(batch + 2))
    lens = [17, 255, 1, 100, 64, 33, 5, 9]
    for sid, n in zip(seq_ids, lens):
        alloc.admit(sid, alloc.plan_admit(list(range(n))))
    # dense: lanes 0-5, attended through a view; gathered: lanes 0,2,3,5,6,7, copied out
    live = seq_ids[:batch] if dense else [s for s in seq_ids if s not in (1, 4)]
    for t in (cache.k[0], cache.v[0]):
        t.normal_()
    meta = cache.prepare_decode(live)
    q, k, v = (torch.randn(len(live), h, head_dim, device="cuda", dtype=dtype) for h in (heads, kv_heads, kv_heads))
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
        out = cache.forward_decode(0, q, k, v, meta)  # raises if only the math backend could run it
    with sdpa_kernel([SDPBackend.MATH]):
        want = cache.forward_decode(0, q, k, v, meta)
    torch.testing.assert_close(out, want, atol=2e-2, rtol=2e-2)
    assert cache.counters()["kv_gather_steps"] == (0 if dense else 1)


def test_masked_prefill_never_falls_back_to_the_math_sdpa():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kvbench.kernels.prefill import prefill_attention

    q = torch.randn(40, 32, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(300, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
        out = prefill_attention(q, k, v, 128**-0.5)  # a cached prefix: the masked path
    with sdpa_kernel([SDPBackend.MATH]):
        want = prefill_attention(q, k, v, 128**-0.5)
    torch.testing.assert_close(out, want, atol=2e-2, rtol=2e-2)


def test_no_triton_compile_inside_a_measured_run(compose):
    """After the engine's warm-up, a run with batch and context changing every step compiles nothing."""
    from kvbench.harness.serving.engine import Engine
    from kvbench.harness.model import build_model
    from kvbench.harness.front.resolve import resolve
    from kvbench.harness.serving.workload import Request
    from kvbench.harness.kv.factory import build_cache
    from kvbench.kernels.triton_paged import compiled_variants

    cfg = resolve(compose(["+impl=paged_triton", "model=tiny-llama", "dtype=bfloat16", "device=cuda",
                           "max_seq_len=2048", "batch=4"]))
    model = build_model(cfg.model, torch.bfloat16, torch.device("cuda"), 0)
    cache = build_cache(cfg.impl, cfg, 256 * 2**20, torch.device("cuda"))
    engine = Engine(model, cache, cfg.batch, cfg.max_num_batched_tokens, sync=torch.cuda.synchronize)
    before = compiled_variants()
    assert before >= 3  # the warm-up compiled the decode (one split, several), the merge and the write
    gen = torch.Generator().manual_seed(0)
    lens = [1100, 7, 1500, 64, 1, 900]  # one split and several, batch 4 -> 1, prompt of 1 token
    requests = [Request(i, tuple(torch.randint(0, 4096, (n,), generator=gen).tolist()), 9 + 5 * i)
                for i, n in enumerate(lens)]
    result = engine.run(requests)
    assert len(result.sequences) == len(lens)
    assert compiled_variants() == before, "a Triton kernel compiled inside the measured run"


def test_cuda_op_out_variant_writes_in_place():
    from kvbench.kernels.cuda_op import paged_decode_attention_cuda
    from kvbench.kernels.reference import paged_decode_attention_ref

    gen = torch.Generator(device="cuda").manual_seed(1)
    k_cache, v_cache = (torch.randn(64, 16, 8, 128, device="cuda", generator=gen).bfloat16() for _ in range(2))
    q = torch.randn(5, 32, 128, device="cuda", generator=gen).bfloat16()
    tables = torch.randperm(64, device="cuda", generator=gen)[:60].view(5, 12).int()
    lens = torch.tensor([1, 17, 190, 64, 100], device="cuda", dtype=torch.int32)
    out = torch.full_like(q, float("nan"))
    got = paged_decode_attention_cuda(q, k_cache, v_cache, tables, lens, 0.1, out)
    assert got.data_ptr() == out.data_ptr()
    want = paged_decode_attention_ref(q, k_cache, v_cache, tables, lens, 0.1)
    torch.testing.assert_close(out.float(), want.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("impl", ["contiguous", "orca_oracle", "paged_torch", "paged_triton", "paged_cuda"])
def test_a_decode_step_never_waits_for_the_gpu(impl):
    """prepare_decode and every layer only enqueue work: a device-to-host sync (a pageable
    copy, a boolean mask, reading a length) would stall the host's run-ahead in every step."""
    from kvbench.impls.staging import StagingBuffer

    heads, kv_heads, head_dim, layers, bs, dev = 8, 2, 128, 2, 16, torch.device("cuda")
    tensors = dict(num_layers=layers, num_heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                   dtype=torch.bfloat16, device=dev, bytes_per_token=1)
    if impl == "contiguous":
        from kvbench.impls.contiguous import ContiguousCache
        from kvbench.impls.lane_allocator import LaneAllocator

        cache = ContiguousCache(LaneAllocator(4, 256), **tensors)
    elif impl == "orca_oracle":
        from kvbench.impls.region_allocator import RegionAllocator
        from kvbench.impls.region_cache import RegionCache
        from kvbench.impls.reservation import reserve_oracle

        cache = RegionCache(RegionAllocator(1024, 256, reserve_oracle), **tensors)
    else:
        from kvbench.impls.block_manager import BlockManager
        from kvbench.impls.paged import PagedCache
        from kvbench.kernels.registry import get_paged_kernel

        cache = PagedCache(get_paged_kernel(impl.removeprefix("paged_")), BlockManager(64, bs), **tensors)
    cache.warmup()
    seq_ids = [0, 1, 2, 3]
    for sid, n in zip(seq_ids, [14, 16, 31, 40]):  # steps below cross block boundaries
        cache.allocator.admit(sid, cache.allocator.plan_admit(list(range(n)), total_len=n + 8))
    q = torch.randn(len(seq_ids), heads, head_dim, device=dev, dtype=torch.bfloat16)
    k, v = (torch.randn(len(seq_ids), kv_heads, head_dim, device=dev, dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        for sid in seq_ids:
            cache.allocator.append(sid, [1])
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            staging = StagingBuffer(dev)
            staging.add([1] * len(seq_ids))  # the engine's token ids ride along
            meta = cache.prepare_decode(seq_ids, staging)
            outs = [cache.forward_decode(layer, q, k, v, meta) for layer in range(layers)]
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert all(torch.isfinite(o).all() for o in outs)
