"""The environment a row was measured in: hardware, software, and code version."""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import re
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from kvbench.harness.untrusted.git import git
from kvbench.harness.measure.nvml import driver_version
from kvbench.harness.paths import REPO_ROOT


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
    from kvbench.kernels.cuda_available import cuda_available

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
        from kvbench.kernels.cuda_available import torch_build_constants

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


@functools.cache
def torch_environment(device: str) -> dict:
    """What torch reports of the environment beyond the fingerprint's fields, for env.json only (never the
    rows, whose columns stay the fingerprint's): torch.utils.collect_env's reports (OS, libc, compiler,
    driver, GPUs, CUDA runtime, cuDNN, the CPU as lscpu shows it), torch's build
    (``torch.__config__.show()``: BLAS and LAPACK, MKL, oneDNN, the CPU capability it uses) with its
    ``BLAS_INFO`` and ``LAPACK_INFO`` apart, and its threads as the process starts
    (``torch.__config__.parallel_info()``: ATen, OpenMP and MKL threads and their variables; a CPU row's
    ``cpu_threads`` is what the run then used). Once a process (a sweep's jobs share it), about 0.05 s
    on a CPU machine; ``seconds`` says what the reports took here. Never fails a run: a report that
    fails is named under ``errors``. ``cuda_module_loading`` is asked of a CUDA run only: collect_env
    initialises CUDA for it, which a CPU run on a GPU machine must not pay for (nor hold a context on
    the GPU)."""
    import torch  # a run that measures imports it anyway: its second is not this record's
    from torch.utils import collect_env as ce

    started = time.perf_counter()
    # each of collect_env's reports a function of its own: all of get_env_info's but the pip and conda
    # package lists (``pip list`` alone took 0.54 s of its 0.6 s here; the fingerprint already names
    # torch's and Triton's versions), clang's and cmake's (not what a run is built with), HIP's and XPU's
    calls = {
        "os": lambda: ce.get_os(ce.run), "libc_version": ce.get_libc_version,
        "gcc_version": lambda: ce.get_gcc_version(ce.run), "python_platform": ce.get_python_platform,
        "nvidia_driver_version": lambda: ce.get_nvidia_driver_version(ce.run),
        "gpu_info": lambda: ce.get_gpu_info(ce.run),
        "cuda_runtime_version": lambda: ce.get_running_cuda_version(ce.run),
        "cudnn_version": lambda: ce.get_cudnn_version(ce.run),
        "cuda_module_loading": ce.get_cuda_module_loading_config if device == "cuda" else lambda: "N/A",
        "caching_allocator_config": ce.get_cachingallocator_config, "is_xnnpack_available": ce.is_xnnpack_available,
        "cpu_info": lambda: ce.get_cpu_info(ce.run),
        "build": torch.__config__.show, "parallel_info": torch.__config__.parallel_info,
        "num_threads": torch.get_num_threads, "num_interop_threads": torch.get_num_interop_threads,
    }
    out: dict = {}
    errors: dict[str, str] = {}
    for key, call in calls.items():
        try:
            value = call()
        except Exception as e:  # noqa: BLE001 - a missing tool or an odd platform: named, not raised
            value, errors[key] = None, f"{type(e).__name__}: {e}"
        out[key] = value if value is None or isinstance(value, (bool, int, float, str)) else str(value)
    build = out.get("build") or ""
    for key in ("BLAS_INFO", "LAPACK_INFO"):
        found = re.search(rf"\b{key}=([^,\s]+)", build)
        out[key.lower()] = found.group(1) if found else None
    out["errors"] = errors or None
    out["seconds"] = round(time.perf_counter() - started, 3)
    return out


def env_record(fingerprint: Fingerprint, with_torch: bool = True) -> dict:
    """env.json: the fingerprint (a row's columns) and, under ``torch_environment``, ``torch_environment()``.
    ``with_torch=False`` (a bookkeeping run, which never imports torch: the import alone costs about a
    second) leaves it None."""
    return {**fingerprint.as_dict(),
            "torch_environment": torch_environment(fingerprint.device) if with_torch else None}
