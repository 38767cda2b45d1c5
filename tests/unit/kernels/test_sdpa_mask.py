"""additive_mask: the float mask SDPA makes of a boolean one, made once per decode step (issue 23's lean
step) instead of by SDPA at every layer; attending through it gives the boolean mask's output bit for bit."""

from __future__ import annotations

import pytest
import torch

from kvbench.kernels.sdpa import additive_mask, decode_sdpa

B, L, KV_HEADS, HEADS, HEAD_DIM = 3, 29, 2, 6, 24


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_through_the_additive_mask_equals_the_boolean_mask(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, HEADS, HEAD_DIM, generator=gen).to(dtype)
    keys = torch.randn(B, L, KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
    values = torch.randn(B, L, KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
    lens = torch.tensor([5, L, 17])  # rows masked in part, and one not at all
    mask = (torch.arange(L)[None, :] < lens[:, None])[:, None, None, :]
    bias = additive_mask(mask, dtype)
    assert bias.dtype == dtype and bias.shape == mask.shape
    assert torch.equal(bias == 0, mask) and bool(torch.isneginf(bias[~mask]).all())
    want = decode_sdpa(q, keys, values, 0.3, mask)
    assert torch.equal(decode_sdpa(q, keys, values, 0.3, bias), want)


@pytest.mark.parametrize("impl, module, cls", [("contiguous", "kvbench.impls.contiguous", "ContiguousCache"),
                                               ("orca_pow2", "kvbench.impls.region_cache", "RegionCache")])
def test_a_slab_cache_converts_its_mask_once_a_step(compose, tmp_path, monkeypatch, impl, module, cls) -> None:
    """The contiguous cache and the Orca regions make each decode step's float mask at its first layer and
    reuse it at every other; their tokens stay HF's (test_engine_vs_hf_generate) and paged's (test_engine_parity)."""
    import importlib

    import kvbench.kernels.sdpa as sdpa
    from kvbench.harness.front.job import run_job

    cache = getattr(importlib.import_module(module), cls)
    made, steps = [], []
    real_mask, real_prepare = sdpa.additive_mask, cache.prepare_decode
    monkeypatch.setattr(sdpa, "additive_mask", lambda mask, dtype: made.append(dtype) or real_mask(mask, dtype))
    monkeypatch.setattr(cache, "prepare_decode", lambda self, *a, **k: steps.append(1) or real_prepare(self, *a, **k))
    rows, code = run_job(compose([f"+impl={impl}", "model=tiny-llama", "dtype=float32", "max_seq_len=128",
                                  "scenario.warmup=0", "device=cpu", "batch=3", "workload=uniform",
                                  "workload.num_requests=4", "workload.prompt_len=9", "workload.output_len=5"]),
                         tmp_path / "run")
    assert code == 0, rows[0].get("error")
    assert steps and len(made) == len(steps) and set(made) == {torch.float32}
