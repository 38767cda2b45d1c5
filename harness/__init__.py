"""kvbench: the benchmark harness (entry point ``python -m harness``, or ``kvbench``).

Python imports it as ``kvbench.harness`` (pyproject.toml maps the folders harness/, impls/ and kernels/ under
one ``kvbench`` name, so no folder of the checkout is another distribution's import name).
"""

import os

# kvbench compares generated tokens bit for bit across impls. MKL's dynamic threading
# picks fewer threads when the machine is busy, which changes fp32 GEMM reduction
# order, so the same run could generate different tokens under load. Fix the team
# size (set before torch is imported; an explicit setting in the environment wins).
os.environ.setdefault("MKL_DYNAMIC", "FALSE")

# Triton's interpreter where there is no GPU, before anything imports triton (torch.compile may).
try:
    from kvbench.kernels import triton_mode  # noqa: E402, F401
except ModuleNotFoundError as e:  # `python -m harness` in a checkout that was never installed
    if e.name != "kvbench":
        raise
    raise ModuleNotFoundError("kvbench is not installed in this Python: run `make setup` (or `pip install -e .` "
                              "in the checkout), which maps harness/, impls/ and kernels/ under the name kvbench",
                              name="kvbench") from None
