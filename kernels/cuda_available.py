"""Whether torch sees a CUDA GPU, without importing torch where its build has no GPU backend.

In kernels/ (the lowest layer) because kernels/__init__.py asks it before any Triton import;
the harness asks it to resolve ``device=auto``.

Importing torch takes about a second, and resolving ``device=auto`` is all that config
validation wants of it. A build made without CUDA and ROCm (``torch/version.py``: ``cuda``
and ``hip`` are None) can never see a GPU, and that file is read without importing torch;
any other build, or a file that does not read as expected, asks torch itself.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path


def torch_build_constants() -> dict | None:
    """torch/version.py's constants (``__version__``, ``cuda``, ``hip``, ...), read without importing
    torch; None when torch is absent or the file does not read as expected."""
    try:
        spec = importlib.util.find_spec("torch")  # finds the package, does not run it
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        tree = ast.parse((Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    values = {}
    for node in tree.body:  # `cuda: Optional[str] = None`, `hip: Optional[str] = '6.2'`
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and isinstance(node.value, ast.Constant):
            values[target.id] = node.value.value
    return values


def _gpu_backend_built() -> bool | None:
    """False when torch/version.py says torch was built without CUDA and ROCm; None when it cannot tell."""
    values = torch_build_constants()
    if values is None or "cuda" not in values or "hip" not in values:
        return None
    return values["cuda"] is not None or values["hip"] is not None


def cuda_available() -> bool:
    """``torch.cuda.is_available()``, importing torch only for a build that has a GPU backend."""
    if "torch" not in sys.modules and _gpu_backend_built() is False:
        return False
    import torch

    return torch.cuda.is_available()
