"""The decode kernels by name; all take the same arguments (kernels/reference.py).

The paged kernels read a block pool through block tables. ``sdpa`` reads a contiguous
slab, which is the same thing with one block per sequence (its lane): torch SDPA over
each sequence's row, the contiguous impl's kernel (kernels/sdpa.py ``slab_decode``).
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # config validation reads the names without loading torch
    import torch

from kvbench.kernels.kv_formats import KV_DTYPES
from kvbench.kernels.read_pattern import reads_padded

PAGED_KERNELS = ("torch", "triton", "cuda", "flex")  # over a block pool
SLAB_KERNELS = ("sdpa",)  # over a contiguous slab
KERNELS = (*SLAB_KERNELS, *PAGED_KERNELS)  # the built-in names; a kernel module's dotted path is allowed too
# The cache's kv_dtype values each kernel reads (kernels/kv_formats.py); a kernel module by dotted path
# takes the reference's signature without ``scales``: float caches only. The CUDA op (its .cu, C++ CPU
# twin and emulator) decodes every one and writes every one (``kvbench::write_kv_quant`` quantizes in
# the kernel, as kernels/quant.py does).
KV_DTYPE_SUPPORT = {"sdpa": KV_DTYPES, "torch": KV_DTYPES, "triton": KV_DTYPES, "cuda": KV_DTYPES}
# torch's FlexAttention (kernels/flex.py) reads float caches: it has no per-token scales to apply.
KV_DTYPE_SUPPORT["flex"] = ("auto",)


def kv_dtype_refusal(kernel: str, kv_dtype: str) -> str | None:
    """Why ``kernel`` cannot read a cache of ``kv_dtype``, in one line naming what it reads; None: it can."""
    supported = KV_DTYPE_SUPPORT.get(kernel, ("auto",))
    if kv_dtype in supported:
        return None
    return f"kernel {kernel} reads kv_dtype {', '.join(supported)}, not {kv_dtype}"


@dataclass(frozen=True)
class PagedKernel:
    """One kernel's decode attention and KV write behind the signatures every caller uses.

    ``max_context`` is the longest entry of ``context_lens`` when the caller knows it
    on the host: a kernel that sizes its work by it need not read it from the device.
    ``may_skip=False`` is the caller's word that no slot is < 0, which spares a kernel
    that pays for skipping (the torch reference) that work. ``validate=False`` skips the
    argument checks, for a caller that has checked tensors of the same shapes already
    (a KV cache checks the first layer of each step).
    """

    name: str
    # (q, k_cache, v_cache, block_tables, context_lens, scale, out=None, *, max_context=None, validate=True,
    #  scales=None, window=0, sinks=None) -> out; window > 0: a sliding-window layer's, keys older than it masked;
    #  sinks: float32 [heads] attention sinks (kernels/sinks.py) (kernels/reference.py)
    decode: Callable[..., torch.Tensor]
    # (key, value, k_cache, v_cache, slot_mapping, *, may_skip=True, validate=True, scales=None) -> None, in place
    write: Callable[..., None]
    # decode writes its result into ``out`` itself; False: it makes its own tensor, copied into ``out``
    # when one is given (a caller that times the kernel alone passes none)
    out_variant: bool = True
    # runs in an interpreter (Triton's on CPU, TRITON_INTERPRET=1): orders of magnitude slower than compiled
    interpreted: bool = False
    # the cache's ``kv_dtype`` values it reads (kernels/kv_formats.py); a quantized one comes with
    # ``scales=`` (kernels/quant.py KVScales) on decode and write
    kv_dtypes: tuple[str, ...] = ("auto",)
    # its decode reads every sequence up to the batch's longest context, masked (kernels/read_pattern.py)
    padded_read: bool = False

    def kv_dtype_error(self, kv_dtype: str) -> str | None:
        """Why this kernel cannot read a cache of ``kv_dtype``, in one line; None: it can."""
        return None if kv_dtype in self.kv_dtypes else kv_dtype_refusal(self.name, kv_dtype)


_SOURCES = {
    "torch": ("kvbench.kernels.reference", "paged_decode_attention_ref", "write_kv_ref"),
    "triton": ("kvbench.kernels.triton_paged", "paged_decode_attention_triton", "write_kv_triton"),
    "cuda": ("kvbench.kernels.cuda_op", "paged_decode_attention_cuda", "write_kv_cuda"),
}


# A timed row of the Triton kernel on a CPU says what its figures are (``+impl=paged`` picks the C++ kernel there).
INTERPRETED_NOTE = ("kernel_backend=triton-interpreter: Triton's interpreter runs the kernel, 30-40x slower than "
                    "the paged_cuda op's C++ kernel on this CPU (+impl=paged runs that one): its times test the "
                    "kernel, they do not measure paging")


def _triton_interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def kernel_backend(kernel: str, device_type: str, gather: bool = False) -> str:
    """What really runs for ``kernel`` on ``device_type``, so no CPU row reads as a GPU figure.

    ``cuda`` is the op's CUDA kernel on a GPU and its C++ kernel on CPU; ``triton`` is
    compiled on a GPU and runs in the numpy interpreter on CPU; ``sdpa`` is torch's SDPA
    (the contiguous impl), ``torch`` the gather reference. ``gather``: the cache copies
    each sequence's K/V out of its region first (``sdpa+gather``, the variable-size
    reservation policies), so the row does not read as the kernel alone.
    """
    if gather:
        return f"{kernel_backend(kernel, device_type)}+gather"
    if kernel == "cuda":
        return "cuda" if device_type == "cuda" else "cpp-cpu"
    if kernel == "triton":
        return "triton-interpreter" if _triton_interpreted() else "triton"
    if kernel == "flex":  # flex-compiled (the fused kernel) or flex-eager (its math path), kernels/flex_mode.py
        from kvbench.kernels.flex_mode import flex_mode

        return f"flex-{flex_mode(device_type)}"
    return kernel


def _into(out: torch.Tensor | None, res: torch.Tensor) -> torch.Tensor:
    """A kernel's result in the caller's ``out`` when one was given (kernels without an out-variant)."""
    if out is None or res is out:
        return res
    return out.copy_(res)


def _reference(decode_ref: Callable[..., torch.Tensor], write_ref: Callable[..., None]) -> PagedKernel:
    # The oracle checks nothing (it takes any shape, e.g. the HF tests' head_dim 32), so
    # ``validate`` has nothing to skip; it has no ``out`` either, so the result is copied.
    def decode(q, k_cache, v_cache, block_tables, context_lens, scale, out=None, *, max_context=None, validate=True,
               scales=None, window=0, sinks=None):
        return _into(out, decode_ref(q, k_cache, v_cache, block_tables, context_lens, scale, max_context, scales,
                                     window, sinks))

    def write(key, value, k_cache, v_cache, slot_mapping, *, may_skip=True, validate=True, scales=None):
        write_ref(key, value, k_cache, v_cache, slot_mapping, may_skip, scales)

    return PagedKernel("torch", decode, write, out_variant=False, kv_dtypes=KV_DTYPE_SUPPORT["torch"],
                       padded_read=reads_padded("torch"))


def _sdpa() -> PagedKernel:
    """SDPA over a slab; a slab's lane is a block of ``max_seq_len`` slots, so the reference writes it."""
    from kvbench.kernels.reference import write_kv_ref
    from kvbench.kernels.sdpa import slab_decode

    def write(key, value, k_cache, v_cache, slot_mapping, *, may_skip=True, validate=True, scales=None):
        write_kv_ref(key, value, k_cache, v_cache, slot_mapping, may_skip, scales)

    return PagedKernel("sdpa", slab_decode, write, out_variant=False, kv_dtypes=KV_DTYPE_SUPPORT["sdpa"])


def _flex() -> PagedKernel:
    """torch's FlexAttention over the pool (kernels/flex.py); its decode takes the reference's signature and
    ``sinks``, and writes ``out``. The reference writes the KV (flex is attention only)."""
    from kvbench.kernels.flex import flex_decode
    from kvbench.kernels.reference import write_kv_ref

    def write(key, value, k_cache, v_cache, slot_mapping, *, may_skip=True, validate=True, scales=None):
        write_kv_ref(key, value, k_cache, v_cache, slot_mapping, may_skip, scales)

    return PagedKernel("flex", flex_decode, write, kv_dtypes=KV_DTYPE_SUPPORT["flex"])


def _cuda_decode(decode_op: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    # The op reads the context lengths on the device: it takes no host bound.
    def decode(q, k_cache, v_cache, block_tables, context_lens, scale, out=None, *, max_context=None, validate=True,
               scales=None, window=0, sinks=None):
        return decode_op(q, k_cache, v_cache, block_tables, context_lens, scale, out, validate=validate, scales=scales,
                         window=window, sinks=sinks)

    return decode


def _masked_store_write(write_fn: Callable[..., None]) -> Callable[..., None]:
    # Triton and CUDA skip a slot < 0 with a masked store, at no cost: ``may_skip``
    # changes nothing for them.
    def write(key, value, k_cache, v_cache, slot_mapping, *, may_skip=True, validate=True, scales=None):
        if scales is None:
            write_fn(key, value, k_cache, v_cache, slot_mapping, validate=validate)
        else:
            write_fn(key, value, k_cache, v_cache, slot_mapping, validate=validate, scales=scales)

    return write


def _plugin(name: str) -> PagedKernel:
    """A kernel module named by its dotted path: it defines ``decode`` and ``write`` with the
    reference kernel's signatures and semantics (kernels/reference.py); the callers' hints
    (``max_context``, ``may_skip``, ``validate``) are not passed to it."""
    try:
        module = importlib.import_module(plugin_module(name))
    except ImportError as e:
        raise ValueError(f"paged kernel module {name!r} does not import: {e}") from e
    missing = [f for f in ("decode", "write") if not callable(getattr(module, f, None))]
    if missing:
        raise ValueError(f"paged kernel module {name!r} defines no {' or '.join(missing)}(...): "
                         "see kernels/reference.py for the signatures")

    def decode(q, k_cache, v_cache, block_tables, context_lens, scale, out=None, *, max_context=None, validate=True,
               window=0, sinks=None):
        if window > 0 or sinks is not None:  # the module's signature has neither: it would attend to every key
            from kvbench.kernels.validate import KernelArgumentError

            what = f"sliding window (window={window})" if window > 0 else "attention sinks"
            layers = "sliding_attention layers" if window > 0 else "attention sinks (gpt-oss)"
            raise KernelArgumentError(f"paged kernel module {name!r} takes no {what}; a model with {layers} "
                                      f"runs the built-in kernels {', '.join(KERNELS)}")
        return _into(out, module.decode(q, k_cache, v_cache, block_tables, context_lens, scale, out=out))

    def write(key, value, k_cache, v_cache, slot_mapping, *, may_skip=True, validate=True):
        module.write(key, value, k_cache, v_cache, slot_mapping)

    return PagedKernel(name, decode, write, out_variant=False)


# kvbench's own folders, as a user names them (``kernels.cuda_emulated``): Python imports them under ``kvbench.``
OWN_FOLDERS = ("harness", "impls", "kernels")


def plugin_module(name: str) -> str:
    """The import name of the kernel module ``name``: a path into kvbench's own folders is imported under the
    ``kvbench`` namespace (pyproject.toml); any other dotted path as written. Rows keep ``name`` as the user wrote it."""
    return f"kvbench.{name}" if name.split(".", 1)[0] in OWN_FOLDERS else name


def is_plugin(name: str) -> bool:
    return "." in name


def get_paged_kernel(name: str) -> PagedKernel:
    """A built-in kernel by short name (``KERNELS``), or any module by dotted path (``_plugin``)."""
    if is_plugin(name):
        return _plugin(name)
    if name == "sdpa":
        return _sdpa()
    if name == "flex":
        return _flex()
    if name not in _SOURCES:
        raise ValueError(f"unknown kernel {name!r}; allowed: {', '.join(KERNELS)}, "
                         "or a module's dotted path")
    module_name, decode_name, write_name = _SOURCES[name]
    module = importlib.import_module(module_name)
    decode, write = getattr(module, decode_name), getattr(module, write_name)
    if name == "torch":
        return _reference(decode, write)
    if name == "cuda":
        decode = _cuda_decode(decode)
    return PagedKernel(name, decode, _masked_store_write(write), interpreted=name == "triton" and _triton_interpreted(),
                       kv_dtypes=KV_DTYPE_SUPPORT[name])
