"""kvbench: the benchmark harness (entry point ``python -m harness``)."""

import os

# kvbench compares generated tokens bit for bit across impls. MKL's dynamic threading
# picks fewer threads when the machine is busy, which changes fp32 GEMM reduction
# order, so the same run could generate different tokens under load. Fix the team
# size (set before torch is imported; an explicit setting in the environment wins).
os.environ.setdefault("MKL_DYNAMIC", "FALSE")
