"""Triton's interpreter on a machine without CUDA, switched on before any Triton import.

Triton reads ``TRITON_INTERPRET`` once, at its first import, and has no CPU driver otherwise. This was
kernels/__init__.py. kernels/ has no __init__.py now: Python imports it as ``kvbench.kernels``
(pyproject.toml maps the folder), and a namespace folder never shadows Hugging Face's ``kernels`` distribution when the checkout is on
sys.path. Every module that imports triton imports this one first; so does kvbench.harness.
"""

import os

from kvbench.kernels.cuda_available import cuda_available

if not cuda_available():  # torch is not imported for it where its build has no GPU backend
    os.environ.setdefault("TRITON_INTERPRET", "1")
