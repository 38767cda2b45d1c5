"""Memory and energy tracker (no NVML here: faked at the pynvml boundary) and the max-concurrency search."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import types

import pytest
import torch

from kvbench.harness.serving.engine import Engine
from kvbench.harness.measure import memory, nvml
from kvbench.harness.measure.memory import MemoryTracker
from kvbench.harness.front.job import run_job
from kvbench.harness.serving import engine as engine_module

WAIT_S = 30  # bounds a wait for the sampler thread; reached only if the code under test is broken


def _fake_pynvml(gpus: dict[str, list[int]], energy_mj: list[int] | None = None, *, by_uuid: bool = True,
                 proc_bytes: int = 4096) -> types.ModuleType:
    """pynvml over GPUs listed in NVML's order as {NVML UUID: device memory used, call by call}.

    The last value of a list repeats, so peaks do not depend on how often the sampler ran.
    ``energy_mj``: the energy counter, call by call (None: the board does not support it).
    """
    nv = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    for name in ("NotFound", "FunctionNotFound", "NotSupported", "Unknown"):
        setattr(nv, f"NVMLError_{name}", type(f"NVMLError_{name}", (NVMLError,), {}))
    uuids = list(gpus)
    calls = {"energy": 0, **{u: 0 for u in uuids}}

    def next_value(key: str, values: list[int]) -> int:
        i = min(calls[key], len(values) - 1)
        calls[key] += 1
        return values[i]

    def handle_by_uuid(uuid: str) -> str:
        if uuid not in gpus:
            raise nv.NVMLError_NotFound()
        return uuid

    def energy(handle: str) -> int:
        if energy_mj is None:
            raise nv.NVMLError_NotSupported()
        return next_value("energy", energy_mj)

    nv.NVMLError = NVMLError
    nv.calls = calls
    nv.nvmlInit = lambda: None
    nv.nvmlDeviceGetHandleByIndex = lambda i: uuids[i]
    if by_uuid:
        nv.nvmlDeviceGetHandleByUUID = handle_by_uuid
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=next_value(h, gpus[h]), total=10**12)
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        types.SimpleNamespace(pid=1, usedGpuMemory=5), types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=proc_bytes)]
    nv.nvmlDeviceGetTotalEnergyConsumption = energy
    return nv


def _fake_cuda(monkeypatch, uuids: list[object | None], current: int = 0) -> None:
    """torch.cuda as a CUDA run sees it: its visible devices' UUIDs (None: this torch gives none)."""
    props = [types.SimpleNamespace(**({} if u is None else {"uuid": u})) for u in uuids]
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props[i])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    for name in ("synchronize", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, lambda: None)
    for name in ("max_memory_allocated", "max_memory_reserved"):
        monkeypatch.setattr(torch.cuda, name, lambda: 0)


class _TorchUuid:
    """torch's _CUuuid: str() gives the UUID without NVML's 'GPU-' prefix."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text


# --- NVML device by UUID ---------------------------------------------------------------------

NVML_GPUS = {"GPU-aaaa": [1], "GPU-bbbb": [2], "GPU-cccc": [3], "MIG-dddd": [4]}


@pytest.mark.parametrize("torch_uuid, want", [
    (_TorchUuid("cccc"), "GPU-cccc"),  # CUDA_VISIBLE_DEVICES=2: torch's device 0 is NVML's device 2
    ("GPU-bbbb", "GPU-bbbb"),  # already in NVML's spelling
    (_TorchUuid("dddd"), "MIG-dddd"),  # a MIG instance
])
def test_device_handle_matches_torchs_uuid_not_its_index(monkeypatch, torch_uuid, want):
    nv = _fake_pynvml(NVML_GPUS)
    nv.nvmlDeviceGetHandleByIndex = lambda i: pytest.fail("looked up by index")
    _fake_cuda(monkeypatch, [torch_uuid])
    assert nvml.device_handle(nv, 0) == (want, None)


def test_device_handle_for_a_uuid_nvml_does_not_list_is_none_with_a_note(monkeypatch):
    _fake_cuda(monkeypatch, [_TorchUuid("eeee")])
    handle, note = nvml.device_handle(_fake_pynvml(NVML_GPUS), 0)
    assert handle is None and "eeee" in note


def _no_function(nv):
    def missing(uuid):
        raise nv.NVMLError_FunctionNotFound()

    nv.nvmlDeviceGetHandleByUUID = missing
    return nv


@pytest.mark.parametrize("torch_uuid, nv, why", [
    (None, _fake_pynvml(NVML_GPUS), "this torch gives no device UUID"),
    (_TorchUuid("cccc"), _fake_pynvml(NVML_GPUS, by_uuid=False), "nvidia-ml-py has no nvmlDeviceGetHandleByUUID"),
    (_TorchUuid("cccc"), _no_function(_fake_pynvml(NVML_GPUS)), "driver's NVML has no nvmlDeviceGetHandleByUUID"),
], ids=["torch", "pynvml", "driver"])
def test_device_handle_falls_back_to_the_index_only_without_uuid_lookup(monkeypatch, torch_uuid, nv, why):
    _fake_cuda(monkeypatch, [None, torch_uuid], current=1)
    handle, note = nvml.device_handle(nv, 1)
    assert handle == "GPU-bbbb" and why in note and "index 1" in note


# --- memory sampler ----------------------------------------------------------------------------


def test_tracker_on_cpu_leaves_nvml_and_energy_empty_and_says_why():
    with MemoryTracker("cpu") as t:
        block = bytearray(64 * 2**20)  # RSS grows while tracked
    r = t.report
    assert r.nvml_used_bytes is None and r.nvml_process_bytes is None and r.torch_allocated_bytes is None
    assert r.energy_j is None and r.avg_power_w is None and r.energy_per_token_j(10) is None
    assert "NVML" in r.notes and "energy" in r.notes and "device=cpu" in r.notes
    assert r.rss_bytes > 64 * 2**20 and r.samples >= 2  # the samples on entry and exit
    del block


def test_tracker_reads_the_gpu_torch_uses_and_reports_peaks(monkeypatch):
    # torch's current device 1 is NVML's second GPU; the first one's memory must not be read.
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml({"GPU-aaaa": [9999], "GPU-bbbb": [100, 700, 300]}))
    _fake_cuda(monkeypatch, [_TorchUuid("cccc"), _TorchUuid("bbbb")], current=1)
    with MemoryTracker("cuda", interval_s=0.001) as t:
        pass
    r = t.report
    assert r.nvml_baseline_bytes == 100 and r.nvml_used_bytes == 700  # the peak, not the last sample
    assert r.nvml_process_bytes == 4096  # this process's entry, not the other one
    assert r.notes == "energy unavailable: NVMLError_NotSupported"


def test_sampler_errors_reach_the_notes_and_do_not_stop_it(monkeypatch):
    nv = _fake_pynvml({"GPU-aaaa": [100]})
    thread_calls = []
    second_call = threading.Event()
    read = nv.nvmlDeviceGetMemoryInfo

    def flaky(handle):
        if threading.current_thread() is threading.main_thread():
            return read(handle)
        thread_calls.append(handle)
        if len(thread_calls) == 2:  # the first error was caught and the thread went on
            second_call.set()
        raise nv.NVMLError_Unknown("driver hiccup")

    nv.nvmlDeviceGetMemoryInfo = flaky
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    _fake_cuda(monkeypatch, [_TorchUuid("aaaa")])
    with MemoryTracker("cuda", interval_s=0.001, join_timeout_s=WAIT_S) as t:
        assert second_call.wait(WAIT_S)
    r = t.report
    failed = len(thread_calls)
    assert f"{failed} of {failed + r.samples} samples failed (first: NVMLError_Unknown: driver hiccup)" in r.notes
    assert r.nvml_used_bytes == 100  # the samples that worked still count


def test_a_stuck_sampler_cannot_hang_the_run(monkeypatch):
    nv = _fake_pynvml({"GPU-aaaa": [100]}, energy_mj=[1000, 2000])
    entered, release = threading.Event(), threading.Event()
    main_reads = []
    read = nv.nvmlDeviceGetMemoryInfo

    def hanging(handle):
        if threading.current_thread() is threading.main_thread():
            main_reads.append(handle)
            return read(handle)
        entered.set()
        release.wait()  # a driver call that does not return until the test lets it
        return read(handle)

    nv.nvmlDeviceGetMemoryInfo = hanging
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    _fake_cuda(monkeypatch, [_TorchUuid("aaaa")])
    tracker = MemoryTracker("cuda", interval_s=0.001, join_timeout_s=0.01)
    try:
        with tracker:
            assert entered.wait(WAIT_S)
            reads_before_exit = len(main_reads)
        r = tracker.report
        assert "memory sampler still busy" in r.notes and "NVML reads stopped" in r.notes
        assert len(main_reads) == reads_before_exit and nv.calls["energy"] == 1  # no NVML call after it stuck
        assert r.energy_j is None and r.nvml_used_bytes == 100
    finally:
        release.set()
        tracker._thread.join(WAIT_S)


# --- energy ------------------------------------------------------------------------------------


@pytest.mark.parametrize("start, end, joules, why", [
    (1000, 3500, 2.5, None),
    (5000, 1000, None, "went backwards"),  # driver reload or counter reset during the run
    (7000, 7000, None, "did not advance"),
])
def test_energy_between_two_counter_reads(start, end, joules, why):
    got, note = nvml.energy_between(start, end)
    assert got == joules
    assert (note is None) if why is None else (why in note)


def test_energy_unsupported_says_why():
    nv = _fake_pynvml({"GPU-aaaa": [1]})
    assert nvml.read_energy_mj(nv, "GPU-aaaa") == (None, "energy unavailable: NVMLError_NotSupported")
    del nv.nvmlDeviceGetTotalEnergyConsumption  # an nvidia-ml-py from before the call
    value, note = nvml.read_energy_mj(nv, "GPU-aaaa")
    assert value is None and "no nvmlDeviceGetTotalEnergyConsumption" in note


def _clock(monkeypatch, *times: float) -> None:
    """The tracker's perf_counter, returning these readings in turn (its start, then its end)."""
    monkeypatch.setattr(memory, "perf_counter", iter(times).__next__)


@pytest.mark.parametrize("counter, joules, watts, why", [
    ([1000, 3500], 2.5, 1.0, None),  # 2.5 J over 2.5 s
    ([5000, 1000], None, None, "energy dropped: NVML's counter went backwards (driver reloaded or counter reset)"),
    (None, None, None, "energy unavailable: NVMLError_NotSupported"),
], ids=["counted", "reset", "unsupported"])
def test_tracker_energy_over_the_run(monkeypatch, counter, joules, watts, why):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml({"GPU-aaaa": [100]}, energy_mj=counter))
    _fake_cuda(monkeypatch, [_TorchUuid("aaaa")])
    _clock(monkeypatch, 10.0, 12.5)
    with MemoryTracker("cuda") as t:
        pass
    r = t.report
    assert (r.energy_j, r.avg_power_w) == (joules, watts)
    assert r.energy_per_token_j(5) == (None if joules is None else joules / 5)
    assert r.notes == why
    assert r.nvml_used_bytes == 100  # memory is measured whatever the energy counter does


def test_decode_row_on_cpu_has_empty_energy_columns_and_the_reason(compose, tmp_path):
    rows, code = run_job(compose(["+impl=paged_torch", "model=tiny-llama", "max_seq_len=64", "workload.num_requests=2",
                                  "workload.prompt_len=8", "workload.output_len=4", "scenario.warmup=0"]), tmp_path)
    assert code == 0
    row = rows[0]
    assert row["output_tokens"] > 0
    assert row["energy_j"] is None and row["avg_power_w"] is None and row["energy_per_output_token_j"] is None
    assert "energy" in row["notes"] and "device=cpu" in row["notes"]


def test_max_concurrency_search_matches_the_analytic_figure(compose, tmp_path):
    overrides = ["scenario=max_concurrency", "model=tiny-llama", "max_seq_len=64", "workload=fixed",
                 "workload.prompt_len=30", "workload.output_len=10", "device.kv_cache_gb=0.0025",
                 "device.watermark=0"]
    for impl in ("contiguous", "paged_torch"):
        rows, code = run_job(compose([f"+impl={impl}", *overrides]), tmp_path / impl)
        assert code == 0, rows[0].get("error")
        row = rows[0]
        assert row["max_concurrency"] > 1 and row["probes"] > 2
        assert abs(row["max_concurrency"] - row["max_concurrency_analytic"]) <= 1, row


def test_kernel_scenario_rows(compose, tmp_path):
    # tiny-llama's heads: 4 query / 2 KV x 64
    rows, code = run_job(compose(["scenario=kernel", "model=tiny-llama", "dtype=float32", "batch=2",
                                  "scenario.context_len=40", "block_size=8", "scenario.iters=2",
                                  "scenario.warmup=1"]), tmp_path)
    assert code == 0
    ok = [r for r in rows if r["status"] != "skipped"]
    by = {(r["impl"], r["layout"]): r for r in ok}
    assert set(by) == {("contiguous", "contiguous"), ("paged_torch", "paged"), ("paged_torch", "contiguous"),
                       ("paged_triton", "paged"), ("paged_triton", "contiguous"), ("paged_cuda", "paged"),
                       ("paged_cuda", "contiguous"), ("paged_flex", "paged"), ("paged_flex", "contiguous")}
    # K and V of 2 sequences x 40 tokens x 2 kv heads x 64 dims, then q and out of 2 x 4 heads x 64; fp32.
    want_bytes = (2 * (2 * 40 * 2 * 64) + 2 * (2 * 4 * 64)) * 4
    # A reservation policy is memory, not a kernel: one skipped row each, saying why.
    skipped = {r["impl"]: r["error"] for r in rows if r["status"] == "skipped"}
    assert set(skipped) == {"orca_pow2", "orca_oracle"} and all("contiguous" in e for e in skipped.values())
    for r in ok:
        assert r["status"] == "ok", r
        assert r["max_abs_err"] < 1e-4 and r["latency_us_p50"] > 0
        assert r["bytes_moved"] == want_bytes
        assert r["bandwidth_gbps"] == pytest.approx(want_bytes / (r["latency_us_p50"] * 1e-6) / 1e9)
        assert r["copy_bw_gbps"] > 0 and r["peak_bw_gbps"] is None


def test_repeat_reports_median_and_spread(compose, tmp_path, monkeypatch):
    walls = iter([2.0, 1.0, 4.0])  # the three repeats' wall times, in order

    class FixedWallEngine(Engine):
        def run(self, requests, **kw):
            return dataclasses.replace(super().run(requests, **kw), elapsed_s=next(walls))

    monkeypatch.setattr(engine_module, "Engine", FixedWallEngine)  # the decode scenario imports it per run
    rows, code = run_job(compose(["+impl=paged_torch", "repeat=3", "scenario.warmup=0", "model=tiny-llama",
                                  "max_seq_len=64", "workload.num_requests=2", "workload.prompt_len=8",
                                  "workload.output_len=4"]), tmp_path)
    assert code == 0
    row = rows[0]
    tokens = row["prompt_tokens"] + row["output_tokens"]
    # tokens/s of the repeats: tokens/2, tokens/1, tokens/4; median tokens/2, spread (1 - 1/4) / (1/2).
    assert row["wall_s"] == 2.0
    assert row["tokens_per_s"] == pytest.approx(tokens / 2)
    assert row["tokens_per_s_spread"] == pytest.approx(1.5)
    assert "different tokens" not in (row["notes"] or "")  # the repeats generated the same tokens


def test_code_version_from_the_environment_overrides_git(monkeypatch):
    from kvbench.harness.measure.fingerprint import code_version

    monkeypatch.delenv("KVBENCH_GIT_SHA", raising=False)
    sha, dirty = code_version()
    assert sha and len(sha) == 40 and isinstance(dirty, bool)
    monkeypatch.setenv("KVBENCH_GIT_SHA", "abc123")
    monkeypatch.setenv("KVBENCH_GIT_DIRTY", "0")
    assert code_version() == ("abc123", False)
    monkeypatch.delenv("KVBENCH_GIT_DIRTY")
    assert code_version() == ("abc123", None)


def test_git_dirty_counts_untracked_files_but_not_ignored_ones(monkeypatch, tmp_path):
    from kvbench.harness.measure.fingerprint import code_version

    monkeypatch.delenv("KVBENCH_GIT_SHA", raising=False)

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    git("init", "-q")
    (tmp_path / ".gitignore").write_text("runs/\n")
    git("add", ".gitignore")
    git("commit", "-q", "-m", "init")
    assert code_version(tmp_path)[1] is False
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "rows.csv").write_text("x")
    assert code_version(tmp_path)[1] is False  # ignored: a run folder is not code
    (tmp_path / "my_impl.yaml").write_text("name: x")
    assert code_version(tmp_path)[1] is True  # untracked: a config the run may have used
