"""transformers, the reference the model and engine tests compare against, imported with a clear error
where it cannot work beside kvbench.

kvbench's kernels live in a top-level package named ``kernels`` (the repository's ``kernels/``).
transformers 5.25 made Hugging Face's hub-kernels distribution, whose import name is also ``kernels``,
a hard dependency, and imports names from it (``CUDAProperties``, ...) whenever that distribution is
installed. One process has one ``kernels``: with kvbench's first on the path, transformers' import fails
deep inside its modelling code with an ImportError that names neither package. The test extra pins
transformers below 5.25 (pyproject.toml); this check says what is wrong when an environment has the
newer one anyway.
"""

from __future__ import annotations

import importlib.metadata
from types import ModuleType

# transformers' hub-kernels distribution; its import name collides with kvbench's kernels/
HUB_KERNELS_DISTRIBUTION = "kernels"


def hub_kernels_version() -> str | None:
    """The installed version of Hugging Face's ``kernels`` distribution, or None when it is absent."""
    try:
        return importlib.metadata.version(HUB_KERNELS_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def import_transformers() -> ModuleType:
    """``transformers``, or an ImportError naming the package clash and the fix."""
    hub = hub_kernels_version()
    if hub is not None:
        raise ImportError(
            f"Hugging Face's 'kernels' distribution {hub} is installed (transformers >= 5.25 requires it), and "
            "its import name 'kernels' is kvbench's own kernels/ package: transformers would import kvbench's "
            "kernels and fail. Install the test extra's transformers, which is below 5.25 and does not need it: "
            "pip install -e '.[test]' (or: pip uninstall kernels && pip install 'transformers>=4.45,<5.25')")
    import transformers

    return transformers
