"""The CUDA event clock's structure, on CPU: flush, spin past the host's enqueue time, then the events."""

from __future__ import annotations

import time

from kvbench.harness.measure.timing import MIN_SPIN_S, SPIN_MARGIN, CudaEventClock, time_call


class FakeEvent:
    def __init__(self, log: list, name: str) -> None:
        self.log, self.name, self.t = log, name, None

    def record(self) -> None:
        self.log.append(("record", self.name))
        self.t = time.perf_counter()

    def elapsed_time(self, other: "FakeEvent") -> float:
        return (other.t - self.t) * 1e3


class FakeOps:
    """Records what the clock asks of the device, in order."""

    def __init__(self) -> None:
        self.log: list = []
        self.events = 0

    def flush(self) -> None:
        self.log.append(("flush",))

    def spin(self, seconds: float) -> None:
        self.log.append(("spin", seconds))

    def event(self) -> FakeEvent:
        self.events += 1
        return FakeEvent(self.log, "start" if self.events % 2 else "end")

    def synchronize(self) -> None:
        self.log.append(("sync",))


def slow_host_call(log: list, host_s: float):
    def fn() -> None:
        time.sleep(host_s)  # a host that takes this long to enqueue the kernel
        log.append(("call",))
    return fn


def test_each_timed_call_is_flush_spin_start_call_end():
    ops = FakeOps()
    clock = CudaEventClock(ops=ops)
    t = time_call(slow_host_call(ops.log, 0.002), None, warmup=1, iters=3, clock=clock)
    assert t.method == "cuda-events"
    timed = ops.log[ops.log.index(("sync",)) + 1:]  # after the calibration's sync
    assert timed[:-1] == 3 * [("flush",), ("spin", clock.spin_s), ("record", "start"), ("call",), ("record", "end")]
    assert timed[-1] == ("sync",)  # one synchronisation, at the end


def test_the_spin_outlasts_the_hosts_enqueue_time():
    """A host that needs 3 ms to enqueue a call gets a spin of at least SPIN_MARGIN x 3 ms before the start event."""
    ops = FakeOps()
    clock = CudaEventClock(ops=ops)
    time_call(slow_host_call(ops.log, 0.003), None, warmup=0, iters=1, clock=clock)
    assert clock.spin_s >= SPIN_MARGIN * 0.003
    fast = CudaEventClock(ops=FakeOps())
    time_call(lambda: None, None, warmup=0, iters=1, clock=fast)
    assert fast.spin_s == MIN_SPIN_S  # a fast host still gets the floor

