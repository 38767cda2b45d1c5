"""Attention kernels over the paged KV cache.

Importing this package on a machine without CUDA turns on the Triton interpreter
*before* any module with an ``@triton.jit`` kernel is imported: Triton reads
``TRITON_INTERPRET`` once, at first import, and has no CPU driver otherwise.
"""

import os

from kernels.cuda_available import cuda_available

if not cuda_available():  # torch is not imported for it where its build has no GPU backend
    os.environ.setdefault("TRITON_INTERPRET", "1")
