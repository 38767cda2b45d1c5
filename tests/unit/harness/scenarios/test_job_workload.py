"""The workload piece: the run's digest, and the ideal hit rate decided once per job."""

from __future__ import annotations

from kvbench.harness.front.resolve import resolve
from kvbench.harness.scenarios.job_workload import JobWorkload
from kvbench.harness.serving.workload import workload_digest

SMALL = ["+impl=contiguous", "model=tiny-llama", "device=cpu", "max_seq_len=64", "batch=2"]


def _workload(compose, *overrides: str, memo: dict | None = None) -> JobWorkload:
    return JobWorkload(resolve(compose([*SMALL, *overrides])), {} if memo is None else memo)


def test_a_runs_digest_is_the_drawn_one_in_a_burst_and_its_own_under_arrivals(compose):
    """The digest drawing made stands for the requests only while they all arrive at 0; with arrival times the
    run hashes its own requests (an arrival adds to each record)."""
    burst = _workload(compose, "workload=chat", "workload.num_requests=30")
    poisson = _workload(compose, "workload=chat", "workload.num_requests=30", "arrival=poisson", "arrival.rate=4")
    assert burst.drawn.digest == poisson.drawn.digest == burst.digest
    assert burst.digest == workload_digest(burst.requests)
    assert poisson.digest == workload_digest(poisson.requests) != burst.digest


def test_the_ideal_hit_rate_is_the_jobs_memo(compose):
    memo: dict = {}
    shared = _workload(compose, "workload=chat", "workload.num_requests=30", memo=memo)
    rate = shared.ideal_hit_rate()
    assert memo["ideal_hit_rate"] == rate is not None
    memo["ideal_hit_rate"] = 0.5  # as a parent process handed it over
    assert _workload(compose, "workload=chat", memo=memo).ideal_hit_rate() == 0.5


def test_drawing_is_the_one_it_is_given_and_happens_once(compose):
    from kvbench.harness.serving.workload import draw_workload

    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return draw_workload(*args, **kwargs)

    workload = JobWorkload(resolve(compose([*SMALL, "workload.num_requests=3"])), {}, counted)
    assert len(workload.requests) == 3 and workload.digest
    assert workload.notes == list(workload.drawn.notes)  # a burst: no arrival.rate ignored
    assert calls == [1]
    assert workload.request_source() is None  # every arrival known in advance: no closed loop
