"""Which FlexAttention path the ``flex`` kernel takes on a device, torch-free (config and rows read it).

On a GPU ``torch.compile(flex_attention)``: the fused Triton kernel. On CPU flex's eager math path by
default (no compile, sinks supported); ``KVBENCH_FLEX_MODE=compiled`` picks inductor's C++ template
there instead (a compile per shape, no sinks). kernels/flex.py has the trade-off.
"""

from __future__ import annotations

import os

MODES = ("eager", "compiled")
ENV = "KVBENCH_FLEX_MODE"


def flex_mode(device_type: str) -> str:
    """``compiled`` on a GPU; on CPU ``eager`` unless ``KVBENCH_FLEX_MODE`` names another of ``MODES``."""
    if device_type == "cuda":
        return "compiled"
    mode = os.environ.get(ENV, "eager")
    if mode not in MODES:
        raise ValueError(f"{ENV}={mode!r}: allowed {', '.join(MODES)}")
    return mode
