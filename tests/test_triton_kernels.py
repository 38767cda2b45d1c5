"""Triton paged-attention kernels against the pure-torch oracle in kernels/reference.py.

On CPU they run in the Triton interpreter (~400x slower than torch), so the CPU cases
are a hand-picked cover of the axes (dtype, block size, GQA ratio, head_dim, split-K)
rather than their product; the full grid runs under ``-m gpu`` on a CUDA machine.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import kernels  # noqa: F401  (turns on the Triton interpreter without CUDA; before the kernels)
from kernels.reference import paged_decode_attention_ref, write_kv_ref
from kernels.triton_paged import choose_num_splits, paged_decode_attention_triton, write_kv_triton
from kernels.validate import KernelArgumentError

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
ATOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}
MIXED_LENS = [1, 17, 54, 97, 300]


def make_decode_inputs(lens, kv_heads, group, head_dim, block_size, dtype, seed=0, spare_blocks=7):
    """Random q and a cache whose blocks are shuffled across a pool with unused blocks."""
    gen = torch.Generator(DEVICE).manual_seed(seed)
    blocks_per_seq = [(n + block_size - 1) // block_size for n in lens]
    pool = sum(blocks_per_seq) + spare_blocks
    physical = torch.randperm(pool, generator=gen, device=DEVICE).to(torch.int32)
    # Entries past a sequence's last block must be ignored: fill them with -1.
    tables = torch.full((len(lens), max(blocks_per_seq) + 2), -1, dtype=torch.int32, device=DEVICE)
    used = 0
    for row, n in enumerate(blocks_per_seq):
        tables[row, :n] = physical[used:used + n]
        used += n
    shape = (pool, block_size, kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen, device=DEVICE).to(dtype)
    v_cache = torch.randn(shape, generator=gen, device=DEVICE).to(dtype)
    q = torch.randn(len(lens), kv_heads * group, head_dim, generator=gen, device=DEVICE).to(dtype)
    lens_t = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    return q, k_cache, v_cache, tables, lens_t


def check_decode(lens, kv_heads, group, head_dim, block_size, dtype, num_splits, seed=0):
    q, k_cache, v_cache, tables, lens_t = make_decode_inputs(
        lens, kv_heads, group, head_dim, block_size, dtype, seed)
    scale = head_dim ** -0.5
    out = torch.full_like(q, float("nan"))
    got = paged_decode_attention_triton(q, k_cache, v_cache, tables, lens_t, scale, out=out,
                                        num_splits=num_splits)
    assert got is out
    # Reference on the same (possibly half) inputs, computed in fp32.
    want = paged_decode_attention_ref(q.float(), k_cache.float(), v_cache.float(), tables, lens_t, scale)
    assert not torch.isnan(out).any(), "kernel left output rows unwritten"
    torch.testing.assert_close(out.float(), want, atol=ATOL[dtype], rtol=0)


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
    check_decode(MIXED_LENS, kv_heads, group, head_dim, block_size, dtype, num_splits)


@pytest.mark.parametrize("num_splits", [1, 2, 5])
def test_decode_long_context_several_tiles_per_split(num_splits):
    # > 256 tokens per split even in the interpreter: the online-softmax rescale runs
    # inside a split, and with 5 splits the 700-token sequence has empty ones.
    check_decode([1100, 700], 1, 4, 64, 16, torch.float32, num_splits, seed=1)


def test_decode_honours_q_and_out_strides():
    q_full, k_cache, v_cache, tables, lens = make_decode_inputs(MIXED_LENS[:3], 2, 2, 64, 8, torch.float32)
    q_big = torch.randn(3, 8, 2 * 64, device=DEVICE)  # q is every other head, first half of a row
    q_big[:, ::2, :64] = q_full
    q = q_big[:, ::2, :64]
    out_big = torch.full((3, 4, 3 * 64), float("nan"), device=DEVICE)
    out = out_big[:, :, 64:128]
    paged_decode_attention_triton(q, k_cache, v_cache, tables, lens, 0.125, out=out)
    want = paged_decode_attention_ref(q_full, k_cache, v_cache, tables, lens, 0.125)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=0)
    assert torch.isnan(out_big[:, :, :64]).all() and torch.isnan(out_big[:, :, 128:]).all()


def test_decode_allocates_out_in_q_dtype():
    q, k_cache, v_cache, tables, lens = make_decode_inputs([5, 40], 1, 2, 64, 16, torch.float16)
    got = paged_decode_attention_triton(q, k_cache, v_cache, tables, lens, 0.125)
    assert got.dtype == torch.float16 and got.shape == q.shape
    want = paged_decode_attention_ref(q.float(), k_cache.float(), v_cache.float(), tables, lens, 0.125)
    torch.testing.assert_close(got.float(), want, atol=1e-2, rtol=0)


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
    gen = torch.Generator().manual_seed(tokens)
    num_blocks = (2 * tokens + block_size - 1) // block_size + 3
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    v_cache = torch.randn(k_cache.shape, generator=gen).to(dtype).to(DEVICE)
    # Keys strided between heads (a slice of a fused projection); values contiguous.
    key = torch.randn(tokens, kv_heads, 2 * head_dim, generator=gen).to(dtype).to(DEVICE)[..., :head_dim]
    value = torch.randn(tokens, kv_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]
    slots[1::3] = -1  # skipped
    slots = slots.to(DEVICE)
    k_want, v_want = k_cache.clone(), v_cache.clone()
    write_kv_ref(key, value, k_want, v_want, slots)
    write_kv_triton(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache, k_want) and torch.equal(v_cache, v_want)


def test_write_kv_all_skipped_leaves_cache_alone():
    k_cache = torch.randn(4, 8, 2, 64, device=DEVICE)
    v_cache = torch.randn_like(k_cache)
    k0, v0 = k_cache.clone(), v_cache.clone()
    rows = torch.randn(5, 2, 64, device=DEVICE)
    write_kv_triton(rows, rows, k_cache, v_cache, torch.full((5,), -1, dtype=torch.int64, device=DEVICE))
    assert torch.equal(k_cache, k0) and torch.equal(v_cache, v0)


# ---- Argument errors ----

def _good_args():
    q, k_cache, v_cache, tables, lens = make_decode_inputs([3, 9], 2, 2, 64, 8, torch.float32)
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
    check_decode(lens, kv_heads, group, head_dim, block_size, dtype, num_splits)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_decode_gpu_default_split_rule_small_batch():
    # batch 2 x 2 kv heads cannot fill the SMs: the default rule splits a long context.
    check_decode([6000, 333], 2, 4, 128, 16, torch.bfloat16, None)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=lambda d: str(d).replace("torch.", ""))
def test_write_kv_gpu_large(dtype):
    tokens, kv_heads, head_dim, block_size = 4099, 8, 128, 128
    k_cache = torch.randn(64, block_size, kv_heads, head_dim, device=DEVICE).to(dtype)
    v_cache = torch.randn_like(k_cache)
    key, value = (torch.randn(tokens, kv_heads, head_dim, device=DEVICE).to(dtype) for _ in range(2))
    slots = torch.randperm(64 * block_size, device=DEVICE)[:tokens]
    slots[::5] = -1
    k_want, v_want = k_cache.clone(), v_cache.clone()
    write_kv_ref(key, value, k_want, v_want, slots)
    write_kv_triton(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache, k_want) and torch.equal(v_cache, v_want)
