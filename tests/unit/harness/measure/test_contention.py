"""What the process got while measured: its CPU share flags contention; idle waits are not asked-for CPU."""

from __future__ import annotations

import os
import time

import pytest

from kvbench.harness.measure.contention import MAX_STEAL, MAX_WAIT, MIN_SHARE, Contention, ContentionProbe, with_contention


@pytest.mark.parametrize("share, steal, flagged", [
    (1.0, 0.0, False), (MIN_SHARE, 0.0, False), (MIN_SHARE - 0.01, 0.0, True), (0.3, None, True),
    (None, 0.0, False), (1.0, MAX_STEAL + 0.01, True), (None, None, False),
])
def test_a_row_is_contended_below_its_cpu_share_or_above_the_steal(share, steal, flagged):
    c = Contention(share, None if share is None else share * 2, 2, 1.0, 3.5, steal)
    assert c.contended is flagged
    row = with_contention({"notes": "earlier note"}, c)
    assert row["contended"] is flagged
    assert ("contended:" in row["notes"]) is flagged and row["notes"].startswith("earlier note")


@pytest.mark.parametrize("wait, flagged", [(0.0, False), (MAX_WAIT, False), (MAX_WAIT + 0.01, True), (1.5, True)])
def test_the_run_queue_wait_decides_where_the_kernel_reports_it(wait, flagged):
    """A kernel on one thread of two uses half the CPU without waiting for any: not contended."""
    assert Contention(0.5, 1.0, 2, 1.0, 1.0, 0.0, wait).contended is flagged


@pytest.mark.parametrize("threads, others, flagged", [
    (1, 0.0, False), (1, 1.0, False), (1, 1.5, False), (1, 1.6, True), (2, 0.4, False), (2, 0.6, True),
    (1, None, False),
])
def test_other_work_beside_the_threads_flags_the_row_even_without_run_queue_waits(threads, others, flagged):
    """One thread beside two hogs on two cores barely waits for a core, and still runs at half speed."""
    c = Contention(1.0, float(threads), threads, 2.0, 2.0, 0.0, wait_frac=0.0, others_cpu=others, cores=2)
    assert c.contended is flagged and c.crowded is flagged
    note = with_contention({}, c).get("notes") or ""
    assert ("other work used" in note) is flagged
    assert with_contention({}, c)["others_cpu"] == others


def test_a_process_that_sleeps_used_no_cpu_and_waited_for_none():
    with ContentionProbe(threads=1) as probe:
        time.sleep(0.3)
    got = probe.result()
    assert got.cpu_share is not None and got.cpu_share < 0.2
    if got.wait_frac is not None:  # Linux: it waited for no core, so it is not starved (``contended`` may still be
        assert got.wait_frac < 0.05 and not got.starved  # set: the hypervisor's steal is the machine's, not its own)
    # The same wait, declared idle (waiting for arrivals): too short a busy window to say anything.
    assert probe.result(idle_s=0.3).cpu_share is None and not probe.result(idle_s=0.3).contended


def test_busy_work_is_measured_in_cores():
    with ContentionProbe(threads=1) as probe:
        end = time.perf_counter() + 0.3
        while time.perf_counter() < end:
            pass
    got = probe.result()
    assert 0 < got.cpu_util <= 1.1 and got.threads == 1
    assert got.load_avg_before is not None and got.load_avg_after is not None


# ---- the default thread count: the cores other work leaves free ------------------------------------------

def test_free_cores_counts_the_cores_other_work_took(monkeypatch):
    from kvbench.harness.measure import contention

    samples = iter([(0, 0), (150, 200)])  # 150 of 200 jiffies busy
    monkeypatch.setattr(contention, "_busy_and_total", lambda: next(samples))
    assert contention.free_cores(0.0, cores=4) == 1  # 4 cores, 3 busy
    samples = iter([(0, 0), (0, 200)])
    monkeypatch.setattr(contention, "_busy_and_total", lambda: next(samples))
    assert contention.free_cores(0.0, cores=4) == 4  # idle: every core
    samples = iter([(0, 0), (200, 200)])
    monkeypatch.setattr(contention, "_busy_and_total", lambda: next(samples))
    assert contention.free_cores(0.0, cores=4) == 1  # never fewer than one
    monkeypatch.setattr(contention, "_busy_and_total", lambda: None)
    assert contention.free_cores(0.0, cores=3) == 3  # no /proc/stat: every core counts as free


def test_free_cores_leaves_one_thread_beside_a_hog_on_every_core():
    import multiprocessing
    import os

    from kvbench.harness.measure.contention import free_cores

    cores = os.cpu_count() or 1
    hogs = [multiprocessing.get_context("spawn").Process(target=_spin, daemon=True) for _ in range(cores)]
    for h in hogs:
        h.start()
    try:
        import time

        time.sleep(1.0)  # the spawned interpreters start, then spin
        assert free_cores(0.5) == 1
    finally:
        for h in hogs:
            h.kill()
            h.join()


def _spin() -> None:
    while True:
        pass


# ---- the machine's CPU times: psutil's, the same figures /proc/stat gave ----------------------------------

def _old_proc_stat(line: str):  # harness/measure/contention.py's /proc/stat reading before psutil
    values = [int(v) for v in line.split()[1:9]]
    return (values[7], sum(values)), (sum(values) - values[3] - values[4], sum(values))  # (steal, total), (busy, total)


def test_cpu_times_are_the_proc_stat_fields(monkeypatch):
    import psutil

    from kvbench.harness.measure import contention

    line = "cpu  4705 150 1120 16250 520 30 45 60 200 7"  # guest and guest_nice: already in user and nice
    ticks = 100
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest", "guest_nice")
    fake = dict(zip(names, (int(v) / ticks for v in line.split()[1:])))

    class Times(tuple):
        def _asdict(self):
            return fake

    monkeypatch.setattr(psutil, "cpu_times", lambda: Times())
    (steal, total), (busy, total2) = _old_proc_stat(line)
    assert contention._steal_and_total() == pytest.approx((steal / ticks, total / ticks), rel=1e-12)
    assert contention._busy_and_total() == pytest.approx((busy / ticks, total2 / ticks), rel=1e-12)
    # the ratios every figure is made of are the old ones
    got_steal, got_total = contention._steal_and_total()
    assert got_steal / got_total == pytest.approx(steal / total, rel=1e-12)

    del fake["steal"], fake["iowait"]  # a platform that reports neither (macOS): no steal, busy not idle
    assert contention._steal_and_total() is None
    assert contention._busy_and_total()[0] == pytest.approx((4705 + 150 + 1120 + 30 + 45) / ticks)

    def fails():
        raise OSError("no cpu times")

    monkeypatch.setattr(psutil, "cpu_times", fails)
    assert contention._busy_and_total() is None and contention._steal_and_total() is None


def test_cpu_times_agree_with_proc_stat_on_this_machine():
    from pathlib import Path

    from kvbench.harness.measure import contention

    stat = Path("/proc/stat")
    if not stat.exists():
        pytest.skip("no /proc/stat")
    ticks = os.sysconf("SC_CLK_TCK")
    before = _old_proc_stat(stat.read_text().splitlines()[0])
    busy, total = contention._busy_and_total()
    steal, _ = contention._steal_and_total()
    after = _old_proc_stat(stat.read_text().splitlines()[0])
    assert before[1][1] / ticks <= total + 1e-6 and total <= after[1][1] / ticks + 1e-6
    assert before[1][0] / ticks <= busy + 1e-6 and busy <= after[1][0] / ticks + 1e-6
    assert before[0][0] / ticks <= steal + 1e-6 and steal <= after[0][0] / ticks + 1e-6
