"""The paged decode kernels by name; all take the same tensors (kernels/reference.py)."""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Callable

import torch

PAGED_KERNELS = ("torch", "triton", "cuda")


@dataclass(frozen=True)
class PagedKernel:
    name: str
    # (q, k_cache, v_cache, block_tables, context_lens, scale, out=None) -> out
    decode: Callable[..., torch.Tensor]
    # (key, value, k_cache, v_cache, slot_mapping) -> None, in place
    write: Callable[..., None]


_SOURCES = {
    "torch": ("kernels.reference", "paged_decode_attention_ref", "write_kv_ref"),
    "triton": ("kernels.triton_paged", "paged_decode_attention_triton", "write_kv_triton"),
    "cuda": ("kernels.cuda_op", "paged_decode_attention_cuda", "write_kv_cuda"),
}


def kernel_backend(kernel: str, device_type: str) -> str:
    """What really runs for ``kernel`` on ``device_type``, so no CPU row reads as a GPU figure.

    ``cuda`` is the op's CUDA kernel on a GPU and its C++ kernel on CPU; ``triton`` is
    compiled on a GPU and runs in the numpy interpreter on CPU; ``sdpa`` is torch's SDPA
    (the contiguous impl), ``torch`` the gather reference.
    """
    if kernel == "cuda":
        return "cuda" if device_type == "cuda" else "cpp-cpu"
    if kernel == "triton":
        return "triton-interpreter" if os.environ.get("TRITON_INTERPRET") == "1" else "triton"
    return kernel


def _with_out(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def call(q, k_cache, v_cache, block_tables, context_lens, scale, out=None):
        res = fn(q, k_cache, v_cache, block_tables, context_lens, scale)
        if out is None:
            return res
        out.copy_(res)
        return out

    return call


def get_paged_kernel(name: str) -> PagedKernel:
    if name not in _SOURCES:
        raise ValueError(f"unknown paged kernel {name!r}; allowed: {', '.join(PAGED_KERNELS)}")
    module_name, decode_name, write_name = _SOURCES[name]
    module = importlib.import_module(module_name)
    decode = getattr(module, decode_name)
    if name == "torch":
        decode = _with_out(decode)
    return PagedKernel(name, decode, getattr(module, write_name))
