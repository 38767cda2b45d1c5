"""``impl.kernel=native`` (``+impl=paged``): the paged decode kernel that runs at native speed on the run's device.

On a GPU the Triton kernel. On a CPU Triton runs only in its interpreter (30-40x slower than the paged_cuda op's
C++ kernel at the seeds' batch of 100), and a newcomer who types the seed's own command would conclude that
paging is slow: there the op's C++ kernel runs. A bookkeeping run with a simulated GPU (``gpu=NAME``) prices a
GPU's steps, so it takes the GPU's kernel. The built-in paged impls differ only in their kernel, so the impl is
renamed after the kernel chosen and its rows read as that impl's.
"""

from __future__ import annotations

from kvbench.harness.config import Config

NATIVE = "native"
# kernel -> the built-in paged impl that runs it (conf/impl/paged_*.yaml)
PAGED_IMPLS = {"triton": "paged_triton", "cuda": "paged_cuda", "torch": "paged_torch", "flex": "paged_flex"}


def native_kernel(cfg: Config) -> str:
    """The paged kernel that runs natively for ``cfg``'s device (resolved): ``triton`` or ``cuda``."""
    on_gpu = cfg.device.name == "cuda" or (cfg.gpu is not None and cfg.scenario.bookkeeping)
    return "triton" if on_gpu else "cuda"


def resolve_native(cfg: Config) -> bool:
    """Replace ``impl.kernel=native`` by the device's kernel (and a built-in paged impl's name by its kernel's
    impl); whether it did. A timed row of the Triton kernel on a CPU says what its figures are in its notes
    (kernels/registry.py ``INTERPRETED_NOTE``)."""
    impl = cfg.impl
    if impl is None or impl.kernel != NATIVE:
        return False
    impl.kernel = native_kernel(cfg)
    if impl.name in PAGED_IMPLS.values():
        impl.name = PAGED_IMPLS[impl.kernel]
    return True
