"""The op's build cache: a folder per build key, a lock that knows its owner, a time limit.

- **Keyed.** A build goes into ``<root>/<name>-<key>``, the key a hash of the sources'
  contents and every flag, compiler and version that goes into the library. The sources
  are copied into that folder first, so checkouts on one machine with the same sources
  share one build, and checkouts with different sources no longer rebuild over each other.
- **Locked, with an owner.** ``torch.utils.cpp_extension`` guards a build folder with a
  bare ``lock`` file (its ``FileBaton``) that a killed build leaves behind; every later
  build then waits on it forever. Here each build first takes ``kvbench.lock`` with
  ``flock`` and writes its pid into it. The OS drops an flock when its process dies, so
  whoever holds it knows that a ``lock`` file still there is stale (its maker is gone)
  and removes it.
- **Bounded.** The build runs in a child process (``python -m kvbench.kernels.build_cache``) in a
  session of its own, under ``KVBENCH_BUILD_TIMEOUT_S`` (waiting for another builder
  included); past it the child, ninja and the compilers are killed and the error says so.
- **Cached.** ``built.json`` is written after a successful build; with it present the
  library is loaded without a child process.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

BUILD_TIMEOUT_ENV = "KVBENCH_BUILD_TIMEOUT_S"
DEFAULT_BUILD_TIMEOUT_S = 900.0  # the CUDA build of one arch takes a few minutes on a slow host
OWNER_LOCK = "kvbench.lock"  # ours: flock + the builder's pid
TORCH_BATON = "lock"  # torch.utils.cpp_extension's FileBaton in the build folder
STAMP = "built.json"  # written once the library is complete
HEADER_SUFFIXES = (".h", ".hpp", ".cuh")
REPO_ROOT = Path(__file__).resolve().parent.parent


class BuildError(RuntimeError):
    """The build failed, or ran past its time limit."""


@dataclass(frozen=True)
class BuildSpec:
    """Everything that goes into the library: what the key hashes and what the child builds."""

    name: str
    sources: tuple[str, ...]  # absolute paths of the original sources
    extra_cflags: tuple[str, ...]
    extra_cuda_cflags: tuple[str, ...]
    with_cuda: bool
    cxx: str  # the compiler, as found on the PATH
    includes: tuple[str, ...] = ()  # absolute paths of files a source #includes that are not headers (a .cu)


def build_timeout_s() -> float:
    raw = os.environ.get(BUILD_TIMEOUT_ENV)
    if raw is None:
        return DEFAULT_BUILD_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise BuildError(f"{BUILD_TIMEOUT_ENV}={raw!r} must be a number of seconds > 0")
    return value


def _inputs(spec: BuildSpec) -> list[Path]:
    """The sources and the headers beside them (a local #include is part of the build)."""
    sources = [Path(s) for s in spec.sources]
    headers = {h for s in sources for h in s.parent.iterdir() if h.suffix in HEADER_SUFFIXES}
    return sources + sorted(headers | {Path(i) for i in spec.includes})


def build_key(spec: BuildSpec) -> str:
    """A hash of the sources' contents, the flags, the compiler and the versions that shape the library."""
    import torch

    h = hashlib.sha256()
    for path in _inputs(spec):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    context = {
        "spec": {**asdict(spec), "sources": [Path(s).name for s in spec.sources],
                 "includes": [Path(i).name for i in spec.includes],
                 "cxx": shutil.which(spec.cxx) or spec.cxx},
        "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
        "arch_list": os.environ.get("TORCH_CUDA_ARCH_LIST"),
    }
    h.update(json.dumps(context, sort_keys=True).encode())
    return h.hexdigest()[:16]


def build_folder(spec: BuildSpec, root: Path) -> Path:
    return root / f"{spec.name}-{build_key(spec)}"


def library_path(spec: BuildSpec, folder: Path) -> Path:
    return folder / f"{spec.name}.so"


def _stage(spec: BuildSpec, folder: Path) -> list[str]:
    """Copy the inputs into ``folder/src`` (only when changed, so ninja sees them as up to date)."""
    src = folder / "src"
    src.mkdir(parents=True, exist_ok=True)
    for path in _inputs(spec):
        dest = src / path.name
        if not dest.is_file() or dest.read_bytes() != path.read_bytes():
            tmp = dest.with_suffix(dest.suffix + f".{os.getpid()}.tmp")
            shutil.copyfile(path, tmp)
            os.replace(tmp, dest)
    return [str(src / Path(s).name) for s in spec.sources]


def ensure_built(spec: BuildSpec, root: Path, timeout_s: float) -> Path:
    """The library for ``spec``: from the cache, or built in a child process within ``timeout_s``."""
    folder = build_folder(spec, root)
    lib = library_path(spec, folder)
    if (folder / STAMP).is_file() and lib.is_file():
        return lib
    folder.mkdir(parents=True, exist_ok=True)
    job = {**asdict(spec), "sources": _stage(spec, folder), "folder": str(folder)}
    env = {**os.environ, "CXX": spec.cxx,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    # A session of its own: on timeout the whole group (ninja, the compilers) goes, not just python.
    proc = subprocess.Popen([sys.executable, "-m", "kvbench.kernels.build_cache", json.dumps(job)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        last = _last_line(err)
        raise BuildError(f"building {spec.name} in {folder} took longer than {timeout_s:g} s "
                         f"({BUILD_TIMEOUT_ENV} sets the limit){'; ' + last if last else ''}") from None
    except BaseException:  # interrupted (Ctrl-C, a signal turned exception): no orphan compilers
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    if proc.returncode != 0 or not lib.is_file():
        raise BuildError(f"building {spec.name} in {folder} failed (exit {proc.returncode}):\n{err[-4000:]}")
    return lib


def _last_line(text: str | None) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


class OwnerLock:
    """``flock`` on ``folder/kvbench.lock`` with the holder's pid written in it."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / OWNER_LOCK
        self.fd: int | None = None
        self.previous_owner: int | None = None

    def __enter__(self) -> "OwnerLock":
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = self._read_owner()
            print(f"waiting for pid {owner} (building in {self.path.parent})", file=sys.stderr, flush=True)
            fcntl.flock(self.fd, fcntl.LOCK_EX)  # the caller's time limit bounds the wait
        self.previous_owner = self._read_owner()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)
        return self

    def _read_owner(self) -> int | None:
        text = os.pread(self.fd, 64, 0).decode(errors="replace").strip()
        return int(text) if text.isdigit() else None

    def __exit__(self, *exc) -> None:
        os.ftruncate(self.fd, 0)
        os.close(self.fd)  # closing drops the flock


def clear_stale_baton(folder: Path, previous_owner: int | None) -> str | None:
    """Remove torch's ``lock`` left by a dead build (only called with the owner lock held); says what it did."""
    baton = folder / TORCH_BATON
    if not baton.exists():
        return None
    baton.unlink()
    who = f"pid {previous_owner}" if previous_owner is not None else "an earlier build"
    state = "no longer running" if previous_owner is None or not _pid_alive(previous_owner) else "its lock released"
    return f"removed a stale build lock {baton} left by {who} ({state})"


def _build(job: dict) -> None:
    """In the child: take the owner lock, clear a stale baton, build with cpp_extension, stamp."""
    folder = Path(job["folder"])
    with OwnerLock(folder) as lock:
        if note := clear_stale_baton(folder, lock.previous_owner):
            print(note, file=sys.stderr, flush=True)
        if (folder / STAMP).is_file():  # built by the process we waited for
            return
        from torch.utils import cpp_extension

        cpp_extension.load(
            name=job["name"], sources=job["sources"], build_directory=str(folder), is_python_module=False,
            with_cuda=job["with_cuda"], extra_cflags=list(job["extra_cflags"]),
            extra_cuda_cflags=list(job["extra_cuda_cflags"]) or None, verbose=False)
        tmp = folder / f"{STAMP}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({k: job[k] for k in ("name", "with_cuda", "extra_cflags", "extra_cuda_cflags")}))
        os.replace(tmp, folder / STAMP)


if __name__ == "__main__":
    _build(json.loads(sys.argv[1]))
