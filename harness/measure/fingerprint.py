"""The environment a row was measured in: hardware, software, and code version."""

from __future__ import annotations

import hashlib
import os
import platform
import re
import socket
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.untrusted.git import git
from harness.measure.nvml import driver_version
from harness.paths import REPO_ROOT


@dataclass(frozen=True)
class Fingerprint:
    device: str  # cpu | cuda
    device_slug: str  # folder name for published results, e.g. nvidia-h200 / cpu-intel-xeon-2core
    gpu_name: str | None
    gpu_count: int
    gpu_memory_bytes: int | None
    driver_version: str | None
    cuda_version: str | None
    cpu_name: str
    cpu_count: int
    torch_version: str
    triton_version: str | None
    python_version: str
    git_sha: str | None
    git_dirty: bool | None
    hostname_hash: str

    def as_dict(self) -> dict:
        return asdict(self)


def _git(*args: str, repo: Path = REPO_ROOT) -> str | None:
    out = git(*args, repo=repo)
    return out.stdout.strip() if out is not None and out.returncode == 0 else None


def code_version(repo: Path = REPO_ROOT) -> tuple[str | None, bool | None]:
    """(git sha, dirty) of the code that runs.

    Dirty counts untracked files too (a config or an impl the run used but nobody
    committed); ignored ones (run folders, caches) do not count.
    A copy of a checkout whose .git does not match its files (the GPU machine gets the
    working tree with a stale .git) names its commit in KVBENCH_GIT_SHA, and
    KVBENCH_GIT_DIRTY=0/1 says whether the files differ from it; git is asked otherwise.
    """
    if sha := os.environ.get("KVBENCH_GIT_SHA"):
        flag = os.environ.get("KVBENCH_GIT_DIRTY")
        return sha, None if flag is None else flag == "1"
    sha = _git("rev-parse", "HEAD", repo=repo)
    # Published results are rewritten by the runs themselves: they do not make the code dirty.
    status = _git("status", "--porcelain", "--untracked-files=normal", "--", ".", ":(exclude)results", repo=repo)
    return sha, None if status is None else bool(status)


def slugify(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# A CPU's brand string names its model among words that do not: trademarks, the clock, the
# integrated graphics, "Processor", "CPU", "64-Core". A slug keeps vendor, family and model number.
_CPU_TAIL = re.compile(r"\s+(@|w/|with)\s.*$", re.IGNORECASE)
_CPU_NOISE = re.compile(r"\((r|tm|c)\)|\b(processor|cpu|\d+-core)\b", re.IGNORECASE)


def cpu_model_slug(cpu_name: str) -> str:
    """``Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz`` -> ``intel-xeon-platinum-8481c``;
    ``AMD EPYC 7B13 64-Core Processor`` -> ``amd-epyc-7b13``."""
    return slugify(_CPU_NOISE.sub(" ", _CPU_TAIL.sub("", cpu_name))) or "unknown"


def device_slug(device: str) -> str:
    """Folder name for published results: the GPU's name (and count, when more than one), or the
    CPU's model and core count. Two machines that differ in what they measure get different
    folders: a core count alone (``cpu-2core``) names an AMD EPYC and an Intel Xeon alike."""
    if device == "cuda":
        import torch  # lazily: reading a config must not load torch

        count = torch.cuda.device_count()
        name = slugify(torch.cuda.get_device_properties(0).name)
        return f"{name}-x{count}" if count > 1 else name
    return f"cpu-{cpu_model_slug(_cpu_name())}-{os.cpu_count() or 1}core"


def auto_device_slug() -> str:
    """This machine's results folder name: the GPU's when torch sees one, else the CPU's."""
    from kernels.cuda_available import cuda_available

    return device_slug("cuda" if cuda_available() else "cpu")


def register_slug_resolver() -> None:
    """``${kvbench_slug:}`` in configs (the sweep files' output folders) names this machine's slug."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("kvbench_slug"):
        OmegaConf.register_new_resolver("kvbench_slug", auto_device_slug)


def _torch_versions(device: str) -> tuple[str, str | None]:
    """torch's version and the CUDA it was built with. A CPU run reads them from torch/version.py
    when torch is not loaded yet: a bookkeeping run (scenario=capacity) never needs torch, and
    importing it costs about a second; anything unreadable asks torch itself."""
    if device != "cuda" and "torch" not in sys.modules:
        from kernels.cuda_available import torch_build_constants

        values = torch_build_constants() or {}
        if isinstance(values.get("__version__"), str) and "cuda" in values:
            return values["__version__"], values["cuda"]
    import torch

    return torch.__version__, torch.version.cuda


def _triton_version() -> str | None:
    """Without importing triton where it is not loaded (its import is slow): the installed
    distribution's version is the one ``triton.__version__`` reports."""
    if "triton" in sys.modules:
        return getattr(sys.modules["triton"], "__version__", None)
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("triton")
    except PackageNotFoundError:
        return None


def collect(device: str) -> Fingerprint:
    torch_version, cuda_version = _torch_versions(device)
    triton_version = _triton_version()
    gpu_name = gpu_mem = driver = None
    gpu_count = 0
    if device == "cuda":
        import torch

        gpu_count = torch.cuda.device_count()
        props = torch.cuda.get_device_properties(0)
        gpu_name, gpu_mem = props.name, props.total_memory
        driver = driver_version()
    cpus = os.cpu_count() or 1
    sha, dirty = code_version()
    return Fingerprint(
        device=device,
        device_slug=device_slug(device),
        gpu_name=gpu_name,
        gpu_count=gpu_count,
        gpu_memory_bytes=gpu_mem,
        driver_version=driver,
        cuda_version=cuda_version,
        cpu_name=_cpu_name(),
        cpu_count=cpus,
        torch_version=torch_version,
        triton_version=triton_version,
        python_version=platform.python_version(),
        git_sha=sha,
        git_dirty=dirty,
        hostname_hash=hashlib.sha256(socket.gethostname().encode()).hexdigest()[:12],
    )
