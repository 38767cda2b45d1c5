"""GroupedPagedCache: random q/k/v through a block table per group, under kv_manager=hybrid (one pool whose pages
the groups share) and split_pools (a pool per kind), driven as an engine drives a cache (prefill in chunks across
the window's edge, then decode as sliding blocks leave): every output equals naive windowed attention."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from kvbench.harness.kv.groups import kv_groups
from kvbench.harness.model.config import ModelConfig
from kvbench.impls.block_manager import BlockManager
from kvbench.impls.group_pool import NULL, GroupedBlockPool, PoolGroup
from kvbench.impls.grouped_paged import GroupedPagedCache
from kvbench.impls.paged import PagedCache
from kvbench.kernels.registry import get_paged_kernel
from tests.helpers.window_cases import check_cache_windows

HEADS, KV_HEADS, DIM = 4, 2, 64
# (layer types, window): Gemma 3's sliding layers beside fewer full ones (5 to 2: a padded group under hybrid) and
# gpt-oss's alternation; windows that are not a multiple of any block size.
GEMMA = (["sliding_attention"] * 4 + ["full_attention"] + ["sliding_attention"] + ["full_attention"], 13)
GPT_OSS = (["sliding_attention", "full_attention"] * 2, 7)


def _layout(types: list[str], window: int, manager: str, pool_blocks: int = 256):
    """The pool and each group's layers as the factory lays them out (harness/kv/groups.py)."""
    groups = kv_groups(ModelConfig(num_layers=len(types), layer_types=types, sliding_window=window), manager)
    pools = [pool_blocks] * (1 + max(g.pool for g in groups))
    return pools, [PoolGroup(g.kind, g.num_layers, g.page_layers, g.pool) for g in groups], [g.layers for g in groups]


def _cache(kernel: str, types: list[str], window: int, manager: str, block_size: int, cls=GroupedPagedCache,
           **tensor_args) -> GroupedPagedCache:
    pools, groups, layers = _layout(types, window, manager)
    pool = GroupedBlockPool(pools, block_size, groups)
    return cls(get_paged_kernel(kernel), pool, layers, num_layers=len(types), num_heads=HEADS, kv_heads=KV_HEADS,
               head_dim=DIM, dtype=torch.float32, device=torch.device("cpu"), bytes_per_token=2 * KV_HEADS * DIM * 4,
               **tensor_args)


def _windows(types: list[str], window: int) -> list[int]:
    return [window if t == "sliding_attention" else 0 for t in types]


def test_the_layouts_group_as_meant():
    """Gemma's layout under hybrid has a padded group and shares pages; split_pools has a pool per kind."""
    _, groups, layers = _layout(*GEMMA, "hybrid")
    assert [g.layers for g in groups] == [2, 2, 1, 2] and {g.page_layers for g in groups} == {2}
    assert layers[2] == (5,) and {g.pool for g in groups} == {0}
    _, groups, _ = _layout(*GEMMA, "split_pools")
    assert [(g.layers, g.pool) for g in groups] == [(5, 0), (2, 1)]


@pytest.mark.parametrize("layout", [GEMMA, GPT_OSS], ids=["gemma", "gpt_oss"])
@pytest.mark.parametrize("manager", ["hybrid", "split_pools"])
@pytest.mark.parametrize("kernel,block_size,chunk", [("torch", 4, 5), ("cuda", 16, 9), ("cuda", 8, 100)])
def test_outputs_equal_naive_windowed_attention(layout, manager, kernel, block_size, chunk):
    types, window = layout
    check_cache_windows(_cache(kernel, types, window, manager, block_size), _windows(types, window),
                        prompts=[30, 3, 14], steps=12, chunk=chunk)


@pytest.mark.parametrize("manager", ["hybrid", "split_pools"])
def test_triton_in_the_interpreter(manager):
    pytest.importorskip("triton")
    types, window = GPT_OSS
    check_cache_windows(_cache("triton", types[:2], window, manager, 4), _windows(types[:2], window),
                        prompts=[11, 3], steps=6, chunk=5)


def _outputs(cache, windows: list[int]) -> list[torch.Tensor]:
    """Every forward's output as ``check_cache_windows`` drives ``cache`` (its comparison with the float naive
    attention off: a quantized store is close to it, not equal)."""
    outs: list[torch.Tensor] = []
    for name in ("forward_prefill", "forward_decode"):
        real = getattr(cache, name)
        setattr(cache, name, lambda *args, real=real: outs.append(real(*args)) or outs[-1])
    with mock.patch.object(torch.testing, "assert_close", lambda *args, **kwargs: None):
        check_cache_windows(cache, windows, prompts=[21, 5], steps=6, chunk=8)
    return outs


@pytest.mark.parametrize("kv_dtype,kv_scale", [("int8", "tensor"), ("fp8_e4m3", "token_head")])
@pytest.mark.parametrize("manager", ["hybrid", "split_pools"])
def test_a_quantized_store_attends_as_the_uniform_cache(kv_dtype, kv_scale, manager):
    """Each layer its own static scale, or per-token scales living in its group's pages: every output equals the
    uniform PagedCache's with the same windows and the same store (it keeps every block; the window masks)."""
    types, window = GEMMA
    grouped = _cache("cuda", types, window, manager, 4, kv_dtype=kv_dtype, kv_scale=kv_scale)
    uniform = PagedCache(get_paged_kernel("cuda"), BlockManager(256, 4), num_layers=len(types), num_heads=HEADS,
                         kv_heads=KV_HEADS, head_dim=DIM, dtype=torch.float32, device=torch.device("cpu"),
                         bytes_per_token=1, kv_dtype=kv_dtype, kv_scale=kv_scale)
    assert grouped.k[0].dtype == uniform.k[0].dtype != torch.float32
    got, want = _outputs(grouped, _windows(types, window)), _outputs(uniform, _windows(types, window))
    assert len(got) == len(want) > 0
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    assert any(NULL in t for ts in grouped.allocator.tables.values() for t in ts)  # blocks left the window


class _NaNFreed(GroupedPagedCache):
    """Before every step, each pool's free blocks (those the windows dropped among them) hold NaN; a block handed
    out again holds finite garbage (zeros) once more, as a reused block does: only a freed block's NaN remains."""

    filled = 0
    nulls_seen = 0

    def _poison(self) -> None:
        for p, stores in zip(self.allocator.pools, self.pool_stores):
            free = torch.tensor(list(p.free), dtype=torch.long)
            held = torch.ones(p.num_blocks + 1, dtype=torch.bool)
            held[free] = False
            for s in stores[: 2 * p.page_layers]:  # K and V (a scale of NaN is not what a kernel would meet)
                s[held] = torch.nan_to_num(s[held], nan=0.0)
                s[free] = float("nan")
            self.filled += len(free)
        self.nulls_seen += sum(NULL in t for ts in self.allocator.tables.values() for t in ts)

    def prepare_prefill(self, spans, staging=None):
        self._poison()
        return super().prepare_prefill(spans, staging)

    def prepare_decode(self, seq_ids, staging=None):
        self._poison()
        return super().prepare_decode(seq_ids, staging)


@pytest.mark.parametrize("kernel", ["torch", "cuda"])
@pytest.mark.parametrize("manager", ["hybrid", "split_pools"])
def test_dropped_blocks_garbage_never_leaks(kernel, manager):
    """NULL entries (blocks that left a window, then freed) are never handed to a kernel: the null page stands in,
    and the garbage of the freed blocks (NaN here) reaches no output, even through the torch reference's
    ``0 * value`` of a masked key."""
    types, window = GPT_OSS
    cache = _cache(kernel, types, window, manager, 4, cls=_NaNFreed)
    check_cache_windows(cache, _windows(types, window), prompts=[19, 2, 9], steps=14, chunk=6)
    assert cache.filled and cache.nulls_seen  # blocks were freed and poisoned while tables held NULLs


def test_tables_the_kernel_reads_hold_no_null():
    """Decode's device tables: the null page where the pool's table is NULL, real blocks elsewhere."""
    types, window = GPT_OSS
    cache = _cache("torch", types, window, "hybrid", 4)
    pool = cache.allocator
    pool.admit(0, pool.plan_admit(list(range(20))))
    for _ in range(9):
        pool.append(0, [0])
    meta = cache.prepare_decode([0])
    null = pool.pools[0].num_blocks
    for g, m in enumerate(meta.groups):
        table = pool.tables[0][g]
        got = m.block_tables[0, : len(table)].tolist()
        assert got == [null if b == NULL else b for b in table]
    assert NULL in pool.tables[0][0] and null in meta.groups[0].block_tables[0].tolist()


def test_every_layer_of_a_group_shares_its_page_tensors():
    """A page layer's tensors serve the j-th layer of every group of its pool; no two layers of a group share."""
    cache = _cache("torch", *GEMMA, "hybrid", 4)
    pages = {id(t) for t in cache.k}
    assert len(pages) == 2  # page_layers of the one pool
    for layers in ([0, 1], [2, 3], [4, 6]):
        assert cache.k[layers[0]] is not cache.k[layers[1]]
    assert cache.k[0] is cache.k[2] is cache.k[5] is cache.k[4] and cache.k[1] is cache.k[6]
    assert cache.k[0].shape[0] == cache.allocator.pools[0].num_blocks + 1  # the null page


def test_a_window_wider_than_its_group_is_refused():
    types, window = GPT_OSS
    cache = _cache("torch", types, window, "hybrid", 4)
    with pytest.raises(ValueError, match=r"layer 0 is in a group of sliding window 7.*\[1, 7\], got 0"):
        cache.set_layer_windows([0] * len(types))
    assert cache.windows == _windows(types, window)  # as they were: the group's own


def test_group_layers_must_cover_the_model():
    pools, groups, layers = _layout(*GPT_OSS, "hybrid")
    with pytest.raises(ValueError, match="group_layers must give"):
        GroupedPagedCache(get_paged_kernel("torch"), GroupedBlockPool(pools, 4, groups), [layers[0], layers[0]],
                          num_layers=4, num_heads=HEADS, kv_heads=KV_HEADS, head_dim=DIM, dtype=torch.float32,
                          device=torch.device("cpu"), bytes_per_token=1)


@pytest.mark.parametrize("kernel", ["torch", "cuda"])
@pytest.mark.parametrize("manager", ["hybrid", "split_pools"])
def test_sinks_per_layer(kernel, manager):
    """gpt-oss's layout with learned sinks on its layers (one without): each layer's own reach its kernels."""
    types, window = GPT_OSS
    gen = torch.Generator().manual_seed(1)
    sinks = [torch.randn(HEADS, generator=gen) for _ in types[:-1]] + [None]
    check_cache_windows(_cache(kernel, types, window, manager, 4), _windows(types, window), prompts=[17, 4],
                        steps=9, chunk=6, sinks=sinks)
