"""What a decode kernel reads of a paged cache: each sequence's own context, or a padded window.

The pure-torch reference (``kernels/reference.py`` ``paged_decode_attention_ref``) gathers every
sequence's blocks up to the batch's longest context and masks the rest: its work follows batch x
longest, like a slab cache's SDPA, not the sum of the contexts. The C++/CUDA and Triton kernels
stop at each sequence's own length. Torch-free, so a bookkeeping run can ask without loading torch.
"""

from __future__ import annotations

# Paged decode kernels (conf/impl ``kernel:``) whose work is batch x the longest context in the batch
PADDED_READ_KERNELS = frozenset({"torch"})


def reads_padded(kernel: str | None) -> bool:
    """True when ``kernel``'s decode reads every sequence up to the batch's longest context (masked)."""
    return kernel in PADDED_READ_KERNELS
