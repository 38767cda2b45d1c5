"""The job piece: the identifiers every row carries, and the threads decided once per job."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvbench.harness.front.resolve import resolve
from kvbench.harness.measure import contention
from kvbench.harness.scenarios.job_run import JobRun
from kvbench.harness.scenarios.job_workload import JobWorkload

NO_FINGERPRINT = SimpleNamespace(as_dict=dict)  # the machine's fields are not what is checked here
SMALL = ["+impl=paged_torch", "model=tiny-llama", "device=cpu", "workload.num_requests=4"]


@pytest.mark.parametrize("threads", [None, 3])
def test_a_bookkeeping_row_records_the_configured_threads_without_sampling_the_load(compose, tmp_path, monkeypatch,
                                                                                    threads):
    """A capacity run computes nothing on threads: free_cores' quarter-second sample would only cost a job time."""
    def sampled(*a, **k):
        raise AssertionError("a bookkeeping job sampled the load")

    monkeypatch.setattr(contention, "free_cores", sampled)
    extra = [] if threads is None else [f"cpu_threads={threads}"]
    job = JobRun(resolve(compose(["scenario=capacity", *SMALL, *extra])), tmp_path, NO_FINGERPRINT)
    assert job.cfg.scenario.bookkeeping and job.identifiers(None, JobWorkload(job.cfg))["cpu_threads"] == threads
    timed = JobRun(resolve(compose(SMALL)), tmp_path, NO_FINGERPRINT)  # a decode job samples, when not set
    monkeypatch.setattr(contention, "free_cores", lambda *a, **k: 1)
    assert timed.identifiers(None, JobWorkload(timed.cfg))["cpu_threads"] == 1
    assert timed.memo["cpu_threads"] == 1  # decided once: the memo an isolated impl's process gets


def test_the_rows_carry_the_workloads_digest_unless_drawing_failed_or_the_scenario_draws_none(compose, tmp_path):
    job = JobRun(resolve(compose(SMALL)), tmp_path, NO_FINGERPRINT)
    workload = JobWorkload(job.cfg)
    impl = job.cfg.impl
    ids = job.identifiers(impl, workload)
    assert ids["workload_digest"] == workload.digest and ids["impl"] == "paged_torch"
    assert ids["run_id"] == job.run_id and ids["kv_bytes_per_token"] == job.bytes_per_token
    assert job.identifiers(impl, None)["workload_digest"] is None  # drawing it failed
    kernel = JobRun(resolve(compose([*SMALL, "scenario=kernel"])), tmp_path, NO_FINGERPRINT)
    # the kernel scenario times random K/V: no workload is served, whatever the caller hands in
    assert kernel.identifiers(impl, JobWorkload(kernel.cfg))["workload_digest"] is None
