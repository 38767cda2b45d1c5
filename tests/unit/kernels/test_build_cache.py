"""The op's build cache (kernels/build_cache.py): keyed folders, stale locks, a time limit.

The real op is built at most once here (the ``op`` fixture, shared with test_cuda_op
through the cache); the stale-lock test re-runs its build step, which ninja finds up to date.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvbench.kernels import build_cache, cuda_op
from kvbench.kernels.build_cache import (
    OWNER_LOCK, STAMP, TORCH_BATON, BuildError, BuildSpec, OwnerLock, build_folder, build_key, ensure_built,
)


def spec_of(tmp_path: Path, source: str = "int f() { return 1; }", cflags=("-O3",)) -> BuildSpec:
    folder = tmp_path / "csrc"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "op.cpp").write_text(source)
    return BuildSpec(name="demo", sources=(str(folder / "op.cpp"),), extra_cflags=tuple(cflags),
                     extra_cuda_cflags=(), with_cuda=False, cxx="c++")


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_key_follows_sources_and_flags_not_the_checkout(tmp_path):
    base = build_key(spec_of(tmp_path / "a"))
    assert build_key(spec_of(tmp_path / "b")) == base  # another checkout, same sources: one shared build
    assert build_key(spec_of(tmp_path / "c", cflags=("-O2",))) != base
    assert build_key(spec_of(tmp_path / "d", source="int f() { return 2; }")) != base
    spec = spec_of(tmp_path / "e")
    (Path(spec.sources[0]).parent / "op.h").write_text("#define X 1")  # a header beside the sources counts
    assert build_key(spec) != base
    assert build_folder(spec_of(tmp_path / "a"), tmp_path).name == f"demo-{base}"


def test_op_is_cached_under_its_key(monkeypatch):
    monkeypatch.delenv(build_cache.BUILD_TIMEOUT_ENV, raising=False)
    path = cuda_op.load_op()
    folder = build_folder(cuda_op.op_spec(), cuda_op.build_dir())
    assert path.parent == folder and (folder / STAMP).is_file() and (folder / "src" / "ops.cpp").is_file()


def test_stale_lock_of_a_dead_build_is_cleared_and_the_build_proceeds():
    cuda_op.load_op()  # built (or found) once
    spec = cuda_op.op_spec()
    folder = build_folder(spec, cuda_op.build_dir())
    stamp = (folder / STAMP).read_text()
    try:
        (folder / STAMP).unlink()  # as if the build had been killed mid-compile ...
        (folder / TORCH_BATON).write_text("")  # ... leaving torch's FileBaton behind
        (folder / OWNER_LOCK).write_text(f"{dead_pid()}\n")  # owned by a process that is gone
        path = ensure_built(spec, cuda_op.build_dir(), timeout_s=240)
        assert path.is_file() and (folder / STAMP).is_file()
        assert not (folder / TORCH_BATON).exists()
    finally:
        if not (folder / STAMP).exists():
            (folder / STAMP).write_text(stamp)


def test_a_build_past_its_time_limit_is_stopped_with_a_clear_error(tmp_path):
    spec = spec_of(tmp_path)
    folder = build_folder(spec, tmp_path / "root")
    folder.mkdir(parents=True)
    with OwnerLock(folder):  # a live builder holds the folder: the child waits, then the limit ends it
        with pytest.raises(BuildError, match=r"took longer than 2 s \(KVBENCH_BUILD_TIMEOUT_S sets the limit\)"):
            ensure_built(spec, tmp_path / "root", timeout_s=2)
    assert (folder / OWNER_LOCK).read_text() == ""  # released


def test_owner_lock_records_its_pid(tmp_path):
    with OwnerLock(tmp_path) as lock:
        assert (tmp_path / OWNER_LOCK).read_text() == f"{os.getpid()}\n"
        assert lock.previous_owner is None


@pytest.mark.parametrize("raw", ["0", "abc", "-3"])
def test_bad_time_limit_is_named(monkeypatch, raw):
    monkeypatch.setenv(build_cache.BUILD_TIMEOUT_ENV, raw)
    with pytest.raises(BuildError, match="KVBENCH_BUILD_TIMEOUT_S"):
        build_cache.build_timeout_s()
