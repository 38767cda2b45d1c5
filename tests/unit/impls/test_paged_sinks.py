"""PagedCache with attention sinks on some layers: prefill (whole and chunked across a window's edge) and decode
through each kernel take a layer's sinks, and a layer without them calls its kernels as before."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvbench.impls.block_manager import BlockManager
from kvbench.impls.paged import PagedCache
from kvbench.kernels.registry import get_paged_kernel
from kvbench.kernels.validate import KernelArgumentError
from tests.helpers.sink_cases import check_cache_sinks, layer_sinks, make_sinks

# gpt-oss's layout in small: sliding and full layers, all with sinks, beside a full and a sliding one without.
WINDOWS, HAS_SINKS = [5, 0, 0, 17], [True, True, False, False]


def _cache(kernel: str, block_size: int, layers: int = 4, **options) -> PagedCache:
    return PagedCache(get_paged_kernel(kernel), BlockManager(256, block_size), num_layers=layers, num_heads=4,
                      kv_heads=2, head_dim=64, dtype=torch.float32, device=torch.device("cpu"),
                      bytes_per_token=2 * layers * 2 * 64 * 4, **options)


@pytest.mark.parametrize("kernel", ["torch", "cuda"])
@pytest.mark.parametrize("block_size,chunk", [(1, 100), (8, 7), (16, 16)])
def test_sinks_per_layer(kernel, block_size, chunk):
    check_cache_sinks(_cache(kernel, block_size), WINDOWS, layer_sinks(HAS_SINKS, 4), prompts=[30, 3, 12], steps=4,
                      chunk=chunk)


def test_triton_sinks_in_the_interpreter():
    pytest.importorskip("triton")
    check_cache_sinks(_cache("triton", 8, layers=2), [6, 0], layer_sinks([True, True], 4), prompts=[20, 4], steps=3,
                      chunk=9)


@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "int8"])
def test_sinks_with_a_quantized_cache(kv_dtype):
    """The op decodes its quantized store with sinks; the expected outputs are those over the dequantized keys,
    which the cache's own prefill reads: checked against the reference kernel on the same cache."""
    caches = [_cache(k, 8, layers=2, kv_dtype=kv_dtype, kv_scale="token_head") for k in ("torch", "cuda")]
    from kvbench.impls.base import PrefillSpan

    outs = []
    for cache in caches:
        cache.set_layer_windows([5, 0])
        cache.set_layer_sinks(layer_sinks([True, True], 4))
        alloc, gen = cache.allocator, torch.Generator().manual_seed(0)
        alloc.admit(0, alloc.plan_admit(list(range(13)), total_len=14))
        rand = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
        meta = cache.prepare_prefill([PrefillSpan(0, 0, 13)])
        for layer in range(2):
            cache.forward_prefill(layer, rand(13, 4, 64), rand(13, 2, 64), rand(13, 2, 64), meta)
        alloc.append(0, [0])
        meta = cache.prepare_decode([0])
        outs.append([cache.forward_decode(layer, rand(1, 4, 64), rand(1, 2, 64), rand(1, 2, 64), meta)
                     for layer in range(2)])
    for got, want in zip(outs[1], outs[0]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_a_layer_without_sinks_passes_none(monkeypatch):
    cache = _cache("torch", 8, layers=3)
    calls, real = [], cache.kernel.decode

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(cache, "kernel", dataclasses.replace(cache.kernel, decode=spy))
    check_cache_sinks(cache, [0, 4, 0], layer_sinks([False, True, True], 4), prompts=[9], steps=1, chunk=9)
    assert "sinks" not in calls[0] and "window" not in calls[0]
    assert calls[1]["window"] == 4 and calls[1]["sinks"].dtype == torch.float32 and "window" not in calls[2]


@pytest.mark.parametrize("sinks,match", [
    ([None], "sinks must be 3 entries"),
    ([None, torch.zeros(3), None], "sinks\\[1\\] must be a float tensor \\[num_heads=4\\] or None, got"),
    ([None, None, torch.zeros(4, dtype=torch.int32)], "sinks\\[2\\] must be a float tensor"),
    ([None, [0.0] * 4, None], "sinks\\[1\\] must be a float tensor"),
])
def test_bad_sinks_are_refused(sinks, match):
    with pytest.raises(ValueError, match=match):
        _cache("torch", 8, layers=3).set_layer_sinks(sinks)


def test_sinks_are_kept_as_float32_on_the_cache():
    cache = _cache("torch", 8, layers=2)
    cache.set_layer_sinks([make_sinks(4).to(torch.bfloat16).requires_grad_(), None])
    assert cache.sinks[0].dtype == torch.float32 and not cache.sinks[0].requires_grad and cache.sinks[1] is None


def test_a_kernel_module_refuses_sinks():
    """A plugin kernel (its signature has no sinks) would attend without them: refused by name."""
    cache = _cache("kernels.cuda_emulated", 8, layers=1)
    cache.set_layer_sinks([make_sinks(4)])
    with pytest.raises(KernelArgumentError, match="takes no attention sinks"):
        check_cache_sinks(cache, [0], cache.sinks, prompts=[3], steps=1, chunk=3)
