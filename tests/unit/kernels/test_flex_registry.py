"""The flex kernel by name (kernels/registry.py): what it reads, what a row says ran, and its decode behind the
registry's signature."""

from __future__ import annotations

import pytest
import torch

from kvbench.kernels.flex_mode import ENV
from kvbench.kernels.reference import paged_decode_attention_ref
from kvbench.kernels.registry import KERNELS, PAGED_KERNELS, get_paged_kernel, kernel_backend, kv_dtype_refusal
from tests.helpers.kernel_cases import make_decode_inputs


def test_flex_is_a_built_in_paged_kernel_of_float_caches():
    kernel = get_paged_kernel("flex")
    assert "flex" in PAGED_KERNELS and "flex" in KERNELS
    assert kernel.name == "flex" and kernel.kv_dtypes == ("auto",) and kernel.out_variant
    assert kernel.kv_dtype_error("auto") is None
    assert kv_dtype_refusal("flex", "fp8_e4m3") == "kernel flex reads kv_dtype auto, not fp8_e4m3"


def test_rows_say_which_flex_ran(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert kernel_backend("flex", "cpu") == "flex-eager"
    assert kernel_backend("flex", "cuda") == "flex-compiled"
    monkeypatch.setenv(ENV, "compiled")
    assert kernel_backend("flex", "cpu") == "flex-compiled"
    monkeypatch.setenv(ENV, "fused")
    with pytest.raises(ValueError, match="KVBENCH_FLEX_MODE='fused': allowed eager, compiled"):
        kernel_backend("flex", "cpu")


def test_decode_and_write_through_the_registry():
    kernel = get_paged_kernel("flex")
    q, k, v, tables, lens = make_decode_inputs([3, 20], 2, 2, 16, 8, torch.float32, seed=5)
    new = torch.randn(2, 2, 16, generator=torch.Generator().manual_seed(1))
    slots = torch.tensor([int(tables[0, 0]) * 8 + 2, int(tables[1, 2]) * 8 + 3])  # the last token of each
    want_k, want_v = k.clone(), v.clone()
    want_k.view(-1, 2, 16)[slots], want_v.view(-1, 2, 16)[slots] = new, -new
    kernel.write(new, -new, k, v, slots, may_skip=False)
    assert torch.equal(k, want_k) and torch.equal(v, want_v)
    out = torch.full_like(q, float("nan"))
    assert kernel.decode(q, k, v, tables, lens, 0.25, out, max_context=20, window=4) is out
    torch.testing.assert_close(out, paged_decode_attention_ref(q, k, v, tables, lens, 0.25, window=4))
