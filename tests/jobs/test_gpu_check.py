"""The GPU check's logic, exercised on a CPU machine in seconds (``DRY=1 bash .ci/gpu-check``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from kvbench.harness.front.sweep_check import check, sweep_jobs
from tests.conftest import REPO_ROOT

SCRIPT = REPO_ROOT / ".ci" / "gpu-check"
NEEDED = ("hydra_core-", "omegaconf-", "antlr4_python3_runtime-")


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    """The wheels the GPU machine is sent: the checkout's wheels/, else fetched as `make wheels` does."""
    local = REPO_ROOT / "wheels"
    if all(any(p.name.startswith(n) for p in local.glob("*.whl")) for n in NEEDED):
        return local
    folder = tmp_path_factory.mktemp("wheels")
    proc = subprocess.run(["make", "-s", "wheels", f"WHEELS={folder}"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return folder


def dry_run(out: Path, wheels: Path, **knobs: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DRY": "1", "OUT": str(out), "WHEELS": str(wheels), **knobs}
    return subprocess.run(["bash", str(SCRIPT)], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_dry_run_installs_composes_and_packs_within_the_return_limits(tmp_path, wheels):
    """The recommended run (the script's defaults) composes, most valuable jobs first, and packs within the limits."""
    out = tmp_path / "out"
    proc = dry_run(out, wheels)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (out / "gpu-check.log").read_text()
    assert "installed into" in log and "/kvbench-site." in log  # the --target path, put on PYTHONPATH
    for sweep in sorted((REPO_ROOT / "conf" / "sweep").glob("gpu_*.yaml")):
        assert f"{sweep.name}: " in log and "jobs compose" in log
    # KERNEL_OVERRIDES' default: 3 impls x batch 1,64 x context 1024,4096 x block 16,128; DECODE_BATCHES 64,1.
    assert "gpu_kernel.yaml: 24 jobs compose" in log and "gpu_decode.yaml: 12 jobs compose" in log
    # the target point over an fp8 KV cache: 3 impls x 2 scale granularities, planned after the kernel benchmark
    assert "gpu_kernel_fp8.yaml: 6 jobs compose" in log and ", the fp8 kernel at the target point" in log
    kernel = [ln.split(": ", 1)[1].split() for ln in log.splitlines() if ln.startswith("gpu_kernel.yaml job ")]
    decode = [ln.split(": ", 1)[1].split() for ln in log.splitlines() if ln.startswith("gpu_decode.yaml job ")]
    target = {"batch=64", "scenario.context_len=4096"}
    impls = {"+impl=contiguous", "+impl=paged_triton", "+impl=paged_cuda"}
    assert all(target | {"block_size=16"} <= set(job) for job in kernel[:3])  # every impl's target point first,
    assert {i for job in kernel[:3] for i in job if i.startswith("+impl=")} == impls
    assert all(target | {"block_size=128"} <= set(job) for job in kernel[3:6])  # then block 128 there,
    assert not any(target <= set(job) for job in kernel[6:])  # then the small shapes
    assert all("batch=64" in job for job in decode[:6]) and all("batch=1" in job for job in decode[6:])
    # Nothing that a CPU machine checks spends GPU time: the nvcc/g++ build tests run in make test.
    assert 'GPU tests (-m "gpu"' in log
    files = [p for p in out.rglob("*") if p.is_file()]
    assert 0 < len(files) <= 8 and all(len(p.relative_to(out).parts) <= 3 for p in files)
    assert all(p.stat().st_size <= 16 * 2**20 for p in files)
    (archive,) = out.glob("results-*.tar.gz")
    packed = archive.name.removeprefix("results-").removesuffix(".tar.gz")
    slug = (out / "summary.txt").read_text().split()[0].removeprefix("slug=")
    assert slug and (out / "summary.txt").read_text().startswith(f"slug={slug} dry=1")
    # a published GPU folder (what a GPU run returns), else this machine's, else (none published) another's
    gpu = sorted(p.name for p in (REPO_ROOT / "results").glob("nvidia-*") if p.is_dir())
    if gpu:
        assert packed == gpu[0] and f"packing the published GPU folder results/{packed}" in log
    else:
        assert packed == slug or (not (REPO_ROOT / "results" / slug).exists() and f"no results/{slug} here" in log)
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert names and all(n.startswith(f"results/{packed}") for n in names)  # one device's folder, nothing else


def test_dry_run_stops_when_hydra_cannot_be_installed(tmp_path):
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    proc = dry_run(tmp_path / "out", empty)
    assert proc.returncode == 3
    assert "make wheels" in proc.stdout and "STOP" in proc.stdout


def test_sweep_jobs_is_the_product_of_the_sweeper_values(tmp_path):
    sweep = tmp_path / "gpu_demo.yaml"
    sweep.write_text("hydra:\n  sweeper:\n    params:\n      +impl: contiguous,paged\n      batch: 1,8,64\n")
    jobs = sweep_jobs(sweep)
    assert len(jobs) == 6 and ["+sweep=gpu_demo", "+impl=paged", "batch=64"] in jobs


def test_sweep_jobs_take_the_command_lines_values_over_the_files(tmp_path):
    sweep = tmp_path / "gpu_demo.yaml"
    sweep.write_text("hydra:\n  sweeper:\n    params:\n      +impl: contiguous,paged\n      batch: 1,8,64\n")
    jobs = sweep_jobs(sweep, ["batch=2,4", "scenario.context_len=128"])
    assert len(jobs) == 4 and ["+sweep=gpu_demo", "+impl=paged", "batch=4", "scenario.context_len=128"] in jobs


def test_sweep_check_reports_old_kernel_keys_in_one_line(capsys):
    kernel = REPO_ROOT / "conf" / "sweep" / "gpu_kernel.yaml"
    assert check([kernel], overrides=["+impl=paged_cuda", "batch=64", "scenario.context_len=4096", "block_size=16",
                                      "scenario.batches=[1,16]"]) == 1
    out = capsys.readouterr().out
    assert "FAIL +sweep=gpu_kernel" in out and "scenario.batches" in out and "Could not override" not in out


def test_sweep_check_reports_a_job_that_does_not_validate(capsys):
    decode = REPO_ROOT / "conf" / "sweep" / "cpu_decode.yaml"
    assert check([decode]) == 0
    assert check([decode], extra=["block_size=3"]) == len(sweep_jobs(decode))
    assert "block_size=3 must be a power of two" in capsys.readouterr().out


def test_crash_probe_reports_each_error_source(tmp_path):
    """The probe the GPU check runs after the build: on this machine every C++ check raises."""
    from kvbench.kernels.cuda_op import load_op

    load_op()  # built (or found in the build cache) here, so the probes' processes only load it
    report = tmp_path / "crash-probe.txt"
    proc = subprocess.run([sys.executable, str(REPO_ROOT / ".ci" / "crash_probe.py"), str(report)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    verdicts = [ln for ln in report.read_text().splitlines() if ln.startswith("== ")]
    assert len(verdicts) == 3
    assert all("exit 0; raised:" in ln for ln in verdicts), verdicts
    assert report.read_text().startswith("python ")  # written as the probes go: the header first
    assert any("block_tables[0, 0] = 9" in ln for ln in verdicts)


def test_gpu_only_switches_are_off_where_there_is_no_gpu():
    from kvbench.harness.front.sweep_check import on_this_machine

    job = ["+sweep=gpu_decode", "+impl=paged_cuda", "batch=64", "cuda_graph=true"]
    assert on_this_machine(job, has_gpu=False) == ["+sweep=gpu_decode", "+impl=paged_cuda", "batch=64",
                                                   "cuda_graph=false"]
    assert on_this_machine(job, has_gpu=True) == job


@pytest.mark.parametrize("prefix", ["", "+", "++"])
def test_gpu_only_switches_are_off_however_the_override_is_written(prefix):
    from kvbench.harness.front.sweep_check import on_this_machine

    job = ["+sweep=gpu_decode", f"{prefix}cuda_graph=true", "++batch=64", "~gpu"]
    assert on_this_machine(job, has_gpu=False) == ["+sweep=gpu_decode", f"{prefix}cuda_graph=false", "++batch=64",
                                                   "~gpu"]


def test_crash_probe_keeps_what_it_found_when_stopped_mid_way(tmp_path):
    """A probe that hangs (the GPU check's step limit then kills the script) loses none of the earlier verdicts."""
    import time

    report = tmp_path / "crash-probe.txt"
    code = ("import sys; from pathlib import Path; sys.path.insert(0, '.ci'); import crash_probe as c\n"
            "c._SETUP = ''; c.PROBE_TIMEOUT_S = 120\n"
            "c.PROBES = {'quick': 'raise RuntimeError(\"from C++\")', 'stuck': 'import time; time.sleep(120)'}\n"
            f"c.main(Path({str(report)!r}))\n")
    # A session of its own, so the stuck probe's process goes with it (as the GPU check's step limit kills it).
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "== quick" not in (report.read_text() if report.exists() else ""):
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert "== quick: exit 0; raised: from C++" in report.read_text()
