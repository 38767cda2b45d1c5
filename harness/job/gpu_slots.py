"""One GPU per local worker: ``hydra/launcher=joblib_gpus`` runs a sweep's jobs in parallel,
each worker process pinned to a GPU of its own with ``CUDA_VISIBLE_DEVICES``.

joblib reuses a worker process for several jobs, and CUDA reads ``CUDA_VISIBLE_DEVICES``
once per process, so the GPU is claimed per process, not per job: the first job in a
worker locks the first free GPU (a lock file held open for the life of the process,
released by the OS when it exits, even on a kill) and later jobs there keep it. The
preset starts as many workers as there are GPUs; a worker that finds none free is an
error naming the fix, never a second job on a busy GPU.
"""

from __future__ import annotations

import fcntl
import os
import re
import tempfile
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from kvbench.harness.errors import ConfigError

PINNING_LAUNCHERS = ("joblib_gpus",)  # hydra/launcher options whose workers get a GPU each
PINNED_ENV = "KVBENCH_PINNED_GPU"  # set once a worker holds its GPU (later jobs there keep it)


def visible_gpus() -> list[str]:
    """The GPUs this process may use, without initialising CUDA: CUDA_VISIBLE_DEVICES, else NVML's count."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip()]
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception:  # noqa: BLE001 - no driver, no library: no GPUs
        return []
    return [str(i) for i in range(count)]


def gpu_count() -> int:
    """``${kvbench_gpu_count:}``: workers for the joblib_gpus preset (at least one)."""
    return max(1, len(visible_gpus()))


def register_gpu_count_resolver() -> None:
    if not OmegaConf.has_resolver("kvbench_gpu_count"):
        OmegaConf.register_new_resolver("kvbench_gpu_count", gpu_count)


def lock_dir() -> Path:
    """Machine-wide, so that two sweeps on one machine never share a GPU either."""
    base = os.environ.get("KVBENCH_GPU_LOCK_DIR") or tempfile.gettempdir()
    return Path(base) / f"kvbench-gpus-{os.getuid()}"


def claim_gpu(gpus: list[str], folder: Path) -> str | None:
    """Lock the first free GPU of ``gpus`` for the rest of this process's life; None when all are held."""
    folder.mkdir(parents=True, exist_ok=True)
    for gpu in gpus:
        fd = os.open(folder / f"gpu-{re.sub(r'[^A-Za-z0-9_-]', '_', gpu)}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())  # who holds it, for a person looking
        return gpu  # the descriptor stays open on purpose: the lock lasts as long as the process
    return None


def pin_gpu_for_launcher(cfg: DictConfig) -> str | None:
    """Under a pinning launcher, give this worker process its own GPU (before CUDA starts); returns it."""
    from hydra.core.hydra_config import HydraConfig

    if (pinned := os.environ.get(PINNED_ENV)) is not None:
        return pinned
    if HydraConfig.get().runtime.choices.get("hydra/launcher") not in PINNING_LAUNCHERS:
        return None
    if OmegaConf.select(cfg, "device.name", default="auto") == "cpu":
        return None
    gpus = visible_gpus()
    if not gpus:
        return None
    gpu = claim_gpu(gpus, lock_dir())
    if gpu is None:
        raise ConfigError(
            f"hydra/launcher=joblib_gpus: all {len(gpus)} GPUs ({','.join(gpus)}) are held by other kvbench "
            f"workers (locks in {lock_dir()}); set hydra.launcher.n_jobs={len(gpus)} or fewer")
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    os.environ[PINNED_ENV] = gpu
    return gpu
