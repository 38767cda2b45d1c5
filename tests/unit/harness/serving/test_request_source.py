"""The open-loop source: a fixed list handed out by arrival time."""

from __future__ import annotations

from kvbench.harness.serving.request_source import OpenLoopSource
from kvbench.harness.serving.workload import Request


def test_hands_out_by_arrival_ties_in_list_order():
    reqs = [Request(i, (1,), 1, arrival_s=t) for i, t in enumerate([0.5, 0.0, 0.5, 0.2])]
    src = OpenLoopSource(reqs)
    assert src.next_arrival() == 0.0
    assert [r.request_id for r in src.due(0.1)] == [1]
    assert src.due(0.1) == [] and src.next_arrival() == 0.2
    assert [r.request_id for r in src.due(0.5)] == [3, 0, 2]
    assert src.next_arrival() is None and src.due(99.0) == []


def test_times_override_the_requests_own():
    reqs = [Request(i, (1,), 1) for i in range(3)]
    src = OpenLoopSource(reqs, [2.0, 1.0, 0.0])
    assert [r.request_id for r in src.due(1.0)] == [2, 1]
