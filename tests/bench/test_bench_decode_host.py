"""pytest-benchmark: the host side of one decode step, per impl (`make bench`).

What every GPU figure pays before the GPU does anything: ``prepare_decode`` plus 32
``forward_decode`` calls at batch 256, on CPU with tiny tensors, the attention (and
the Triton launches, which would run in the interpreter) replaced by no-ops. Between
rounds, untimed, every sequence appends a token like a real step, so block tables
grow and finished sequences make room for new ones. A regression in per-step or
per-layer host work (argument checks, small host-to-device copies, table rebuilds)
shows here; nothing asserts a speed.
"""

from __future__ import annotations

import random

import pytest
import torch

BATCH, LAYERS, HEAD_DIM, BLOCK, MAX_LEN = 256, 32, 64, 16, 48
DTYPE = torch.bfloat16  # halves the 32 layers' pools; no kernel does arithmetic here
IMPLS = ["contiguous", "paged_torch", "paged_triton", "paged_cuda"]


class _NoLaunch:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](...)`` does nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def _attention_is_noop(monkeypatch: pytest.MonkeyPatch, impl: str) -> None:
    """Replace what does device work in ``impl``; every wrapper above it still runs."""
    if impl == "contiguous":
        import kvbench.impls.contiguous

        monkeypatch.setattr(kvbench.impls.contiguous, "decode_sdpa", lambda q, keys, values, scale, mask, sinks=None: q)
    elif impl == "paged_torch":
        import kvbench.kernels.reference

        monkeypatch.setattr(kvbench.kernels.reference, "paged_decode_attention_ref", lambda q, *args, **kwargs: q)
    elif impl == "paged_triton":
        import kvbench.kernels.triton_paged
        import kvbench.kernels.triton_write

        monkeypatch.setattr(kvbench.kernels.triton_paged, "_decode_kernel", _NoLaunch())
        monkeypatch.setattr(kvbench.kernels.triton_write, "_write_kv_kernel", _NoLaunch())
    else:
        from kvbench.kernels import cuda_op

        cuda_op.load_op()  # built once; the KV write stays the op's real (tiny) C++ kernel
        monkeypatch.setattr(torch.ops.kvbench, "paged_decode_attention", lambda q, *args: q)


def _cache(impl: str):
    tensors = dict(num_layers=LAYERS, num_heads=1, kv_heads=1, head_dim=HEAD_DIM, dtype=DTYPE,
                   device=torch.device("cpu"), bytes_per_token=1)
    if impl == "contiguous":
        from kvbench.impls.contiguous import ContiguousCache
        from kvbench.impls.lane_allocator import LaneAllocator

        return ContiguousCache(LaneAllocator(BATCH, MAX_LEN), **tensors)
    from kvbench.impls.block_manager import BlockManager
    from kvbench.impls.paged import PagedCache
    from kvbench.kernels.registry import get_paged_kernel

    blocks = BATCH * -(-MAX_LEN // BLOCK)
    return PagedCache(get_paged_kernel(impl.removeprefix("paged_")), BlockManager(blocks, BLOCK), **tensors)


class _Batch:
    """256 live sequences of staggered lengths; a step appends one token to each, and a
    sequence that reached MAX_LEN is released and replaced by a new one (new table)."""

    def __init__(self, allocator) -> None:
        self.alloc = allocator
        self.rng = random.Random(0)
        self.next_id = 0
        self.seq_ids = [self._admit(self.rng.randint(1, MAX_LEN - 1)) for _ in range(BATCH)]

    def _admit(self, length: int) -> int:
        sid, self.next_id = self.next_id, self.next_id + 1
        self.alloc.admit(sid, self.alloc.plan_admit([self.rng.randrange(1000) for _ in range(length)]))
        return sid

    def step(self):
        for i, sid in enumerate(self.seq_ids):
            if self.alloc.num_tokens(sid) >= MAX_LEN:
                self.alloc.release(sid)
                self.seq_ids[i] = self._admit(self.rng.randint(1, BLOCK))
            else:
                self.alloc.append(sid, [self.rng.randrange(1000)])
        return (list(self.seq_ids),), {}


@pytest.mark.parametrize("impl", IMPLS)
def test_bench_decode_step_host(benchmark, monkeypatch, impl):
    _attention_is_noop(monkeypatch, impl)
    cache = _cache(impl)
    batch = _Batch(cache.allocator)
    q = torch.zeros(BATCH, 1, HEAD_DIM, dtype=DTYPE)
    kv = torch.zeros(BATCH, 1, HEAD_DIM, dtype=DTYPE)

    def step(seq_ids: list[int]) -> torch.Tensor:
        meta = cache.prepare_decode(seq_ids)
        for layer in range(LAYERS):
            out = cache.forward_decode(layer, q, kv, kv, meta)
        return out

    out = benchmark.pedantic(step, setup=batch.step, rounds=60, warmup_rounds=5)
    assert out.shape == (BATCH, 1, HEAD_DIM)
