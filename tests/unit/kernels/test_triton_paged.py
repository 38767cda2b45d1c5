"""Triton paged-attention kernels against the pure-torch oracle in kernels/reference.py.

On CPU they run in the Triton interpreter (~400x slower than torch), so the CPU cases
are a hand-picked cover of the axes (dtype, block size, GQA ratio, head_dim, split-K)
rather than their product; the full grid runs under ``-m gpu`` on a CUDA machine.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import kvbench.kernels.triton_mode  # noqa: F401  (turns on the Triton interpreter without CUDA; before the kernels)
from kvbench.kernels.triton_paged import choose_num_splits, paged_decode_attention_triton, write_kv_triton
from kvbench.kernels.validate import KernelArgumentError
from tests.helpers.kernel_cases import (
    MIXED_LENS,
    assert_close_for_dtype,
    check_decode,
    check_write,
    make_decode_inputs,
    reference_decode,
)

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


# One case per row: every dtype meets every CPU block size once; GQA ratios, head dims
# and forced split-K rotate through them.
CPU_CASES = [
    # dtype,        block, kv_heads, group, head_dim, num_splits
    (torch.float32,  1,  2, 4, 64, None),
    (torch.float32,  8,  1, 8, 80, 3),
    (torch.float32, 16,  2, 1, 64, 3),
    (torch.float32, 32,  1, 4, 80, None),
    (torch.float16,  1,  1, 8, 64, 3),
    (torch.float16,  8,  2, 1, 80, None),
    (torch.float16, 16,  1, 4, 64, None),
    (torch.float16, 32,  2, 4, 64, 3),
    (torch.bfloat16, 1,  2, 1, 80, None),
    (torch.bfloat16, 8,  1, 4, 64, 3),
    (torch.bfloat16, 16, 2, 8, 64, 3),
    (torch.bfloat16, 32, 1, 1, 80, None),
    # The other head dims and the largest pages, once each.
    (torch.float32,  64, 1, 4, 96, 3),
    (torch.bfloat16, 128, 1, 2, 128, None),
    (torch.float16, 16, 1, 4, 256, 2),
]


@pytest.mark.parametrize("dtype,block_size,kv_heads,group,head_dim,num_splits", CPU_CASES,
                         ids=lambda v: str(v).replace("torch.", ""))
def test_decode_matches_reference_mixed_lengths(dtype, block_size, kv_heads, group, head_dim, num_splits):
    check_decode(paged_decode_attention_triton, MIXED_LENS, kv_heads, group, head_dim, block_size, dtype, DEVICE,
                 num_splits=num_splits)


@pytest.mark.parametrize("num_splits", [1, 2, 5])
def test_decode_long_context_several_tiles_per_split(num_splits):
    # > 256 tokens per split even in the interpreter: the online-softmax rescale runs
    # inside a split, and with 5 splits the 700-token sequence has empty ones.
    check_decode(paged_decode_attention_triton, [1100, 700], 1, 4, 64, 16, torch.float32, DEVICE, seed=1,
                 num_splits=num_splits)


def test_decode_honours_q_and_out_strides():
    q_full, k_cache, v_cache, tables, lens = make_decode_inputs(MIXED_LENS[:3], 2, 2, 64, 8, torch.float32, DEVICE)
    q_big = torch.randn(3, 8, 2 * 64, device=DEVICE)  # q is every other head, first half of a row
    q_big[:, ::2, :64] = q_full
    q = q_big[:, ::2, :64]
    out_big = torch.full((3, 4, 3 * 64), float("nan"), device=DEVICE)
    out = out_big[:, :, 64:128]
    paged_decode_attention_triton(q, k_cache, v_cache, tables, lens, 0.125, out=out)
    assert_close_for_dtype(out, reference_decode(q_full, k_cache, v_cache, tables, lens, 0.125), torch.float32)
    assert torch.isnan(out_big[:, :, :64]).all() and torch.isnan(out_big[:, :, 128:]).all()


def test_decode_allocates_out_in_q_dtype():
    q, k_cache, v_cache, tables, lens = make_decode_inputs([5, 40], 1, 2, 64, 16, torch.float16, DEVICE)
    got = paged_decode_attention_triton(q, k_cache, v_cache, tables, lens, 0.125)
    assert got.dtype == torch.float16 and got.shape == q.shape
    assert_close_for_dtype(got, reference_decode(q, k_cache, v_cache, tables, lens, 0.125), torch.float16)


def test_split_rule():
    assert choose_num_splits(1, 8, 100_000, None) == 1  # interpreter: never split
    assert choose_num_splits(64, 8, 4096, 132) == 1  # 512 programs already fill 132 SMs
    assert choose_num_splits(1, 8, 256, 132) == 1  # short context: not worth a second pass
    assert choose_num_splits(1, 8, 4096, 132) == 16  # 4096 // 256 caps it
    assert choose_num_splits(16, 8, 1024, 132) == 4  # 1024 // 256 caps it
    assert choose_num_splits(16, 8, 16384, 132) == 5  # ceil(4 * 132 / 128): four programs per SM
    assert choose_num_splits(2, 8, 65536, 132) == 32  # MAX_SPLITS caps ceil(528 / 16)
    assert choose_num_splits(1, 1, 10**6, 132) == 32  # MAX_SPLITS


# ---- KV write ----

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("tokens,kv_heads,head_dim,block_size", [(1, 2, 64, 16), (13, 2, 80, 8), (37, 3, 96, 1)])
def test_write_kv_matches_reference(dtype, tokens, kv_heads, head_dim, block_size):
    check_write(write_kv_triton, tokens, kv_heads, head_dim, block_size, dtype, DEVICE, seed=tokens)


def test_write_kv_all_skipped_leaves_cache_alone():
    k_cache = torch.randn(4, 8, 2, 64, device=DEVICE)
    v_cache = torch.randn_like(k_cache)
    k0, v0 = k_cache.clone(), v_cache.clone()
    rows = torch.randn(5, 2, 64, device=DEVICE)
    write_kv_triton(rows, rows, k_cache, v_cache, torch.full((5,), -1, dtype=torch.int64, device=DEVICE))
    assert torch.equal(k_cache, k0) and torch.equal(v_cache, v0)


# ---- Argument errors ----

def _good_args():
    q, k_cache, v_cache, tables, lens = make_decode_inputs([3, 9], 2, 2, 64, 8, torch.float32, DEVICE)
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=tables, context_lens=lens, scale=0.125)


@pytest.mark.parametrize("change,message", [
    (lambda a: a.update(block_tables=a["block_tables"].long()), "block_tables must be int32"),
    (lambda a: a.update(q=a["q"][..., :32].contiguous()), "head_dim"),
    (lambda a: a.update(q=a["q"].half()), "q is torch.float16 but the cache is torch.float32"),
    (lambda a: a.update(context_lens=a["context_lens"].long()), "context_lens must be int32"),
    (lambda a: a.update(out=torch.empty_like(a["q"]).half()), "out must match q"),
    (lambda a: a.update(num_splits=0), "num_splits"),
], ids=["block_tables_dtype", "head_dim_mismatch", "q_vs_cache_dtype", "context_lens_dtype", "out_dtype", "num_splits"])
def test_decode_rejects_bad_arguments(change, message):
    args = _good_args()
    change(args)
    with pytest.raises(KernelArgumentError, match=message):
        paged_decode_attention_triton(**args)


def test_write_kv_rejects_bad_arguments():
    k_cache = torch.randn(4, 8, 2, 64, device=DEVICE)
    rows = torch.randn(3, 2, 64, device=DEVICE)
    with pytest.raises(KernelArgumentError, match="slot_mapping must be int64"):
        write_kv_triton(rows, rows, k_cache, k_cache.clone(), torch.zeros(3, dtype=torch.int32, device=DEVICE))
    with pytest.raises(KernelArgumentError, match="dtype"):
        write_kv_triton(rows.half(), rows.half(), k_cache, k_cache.clone(), torch.zeros(3, dtype=torch.int64, device=DEVICE))


# ---- The full grid, GPU only ----

# Every head_dim x block size, each with a rotating dtype / GQA ratio / split setting.
GPU_SETTINGS = [(torch.bfloat16, 4, None), (torch.float16, 8, 4), (torch.float32, 1, None),
                (torch.bfloat16, 8, None), (torch.bfloat16, 1, 7), (torch.float16, 4, None)]
GPU_GRID = [
    (*GPU_SETTINGS[i % len(GPU_SETTINGS)], block_size, head_dim)
    for i, (block_size, head_dim) in enumerate(itertools.product([1, 8, 16, 32, 128], [64, 80, 96, 128, 256]))
]


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA: the interpreter is too slow for this grid")
@pytest.mark.parametrize("dtype,group,num_splits,block_size,head_dim", GPU_GRID,
                         ids=lambda v: str(v).replace("torch.", ""))
def test_decode_gpu_grid(dtype, group, num_splits, block_size, head_dim):
    # Batch 64: the awkward lengths, three past 4096, and random ones up to 6000.
    gen = torch.Generator().manual_seed(block_size * 1000 + head_dim)
    lens = MIXED_LENS + [4097, 5000, 8191] + torch.randint(1, 6000, (56,), generator=gen).tolist()
    kv_heads = 8 if group <= 4 else 4  # 8, 32 or 32 query heads
    check_decode(paged_decode_attention_triton, lens, kv_heads, group, head_dim, block_size, dtype, DEVICE,
                 num_splits=num_splits)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_decode_gpu_default_split_rule_small_batch():
    # batch 2 x 2 kv heads cannot fill the SMs: the default rule splits a long context.
    check_decode(paged_decode_attention_triton, [6000, 333], 2, 4, 128, 16, torch.bfloat16, DEVICE)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=lambda d: str(d).replace("torch.", ""))
def test_write_kv_gpu_large(dtype):
    check_write(write_kv_triton, 4099, 8, 128, 128, dtype, DEVICE)
