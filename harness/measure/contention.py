"""What the process really got while it was measured: CPU time over wall time, the load around it, steal.

On a shared machine other work can take the cores a wall-clock figure assumes (a decode job
ran 12x slower under load, and its row still read ``ok``). A probe around the measured work
reads the process's CPU time (every thread), how long its threads waited on the run queue
(``/proc/self/task/*/schedstat``: ready to run, no core free), the 1-minute load average
before and after, and the hypervisor's steal time where the platform reports it (psutil). A row whose
threads waited for a core more than ``MAX_WAIT`` of the busy wall time, or that lost more
than ``MAX_STEAL`` of the machine to steal, is flagged ``contended``: its times say more about
the neighbours than about the cache. (CPU time over wall time alone cannot tell a starved
process from a kernel that runs on one thread of two; the run-queue wait can. Where the
kernel gives no schedstat, the share of the CPU the threads could use stands in.)

The run-queue wait misses one kind of load: other work that takes no core the job's threads
wanted, yet shares what cores cannot split (a hypervisor's sibling hyperthreads, the memory
bus, the last-level cache). A one-thread job beside two CPU hogs on two cores waited almost
never and still ran at under half its idle speed. So the probe also reads how busy the whole
machine was (psutil's cpu_times: /proc/stat on Linux) less the process's own CPU:
``others_cpu``, in cores. A busy row is contended too when its threads and the others together
asked for more than ``MAX_DEMAND`` of the machine's cores. One co-runner beside a one-thread
job on two cores (1 + 1) is recorded in ``others_cpu`` but not flagged: on a shared machine
that is most of the time, and flagged rows leave the figures.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

MAX_WAIT = 0.25  # run-queue wait summed over the threads, over the busy wall time
MIN_SHARE = 0.75  # without schedstat: of the CPU the measured threads could use (threads, at most the cores)
MAX_STEAL = 0.05  # of the machine's CPU time taken by the hypervisor
# The measured threads plus the others' cores, over the machine's cores: 2 cores beside one hog (1 + 1)
# pass, beside two (1 + 2) do not.
MAX_DEMAND = 1.25
BUSY_SHARE = 0.5  # of the CPU its threads could use: below, the process mostly waited on something else


def _run_queue_wait_s() -> float | None:
    """Seconds this process's threads have waited, ready, for a core (schedstat's second field), or None.

    Read from /proc by hand: psutil has no run-queue wait (its per-thread figures are user and
    system time only), and this is the figure that tells a starved process from a one-thread one."""
    total, found = 0, False
    for stat in Path("/proc/self/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[1])
            found = True
        except (OSError, IndexError, ValueError):  # a thread that ended meanwhile
            continue
    return total / 1e9 if found else None


def _cpu_times() -> tuple[float, float | None, float] | None:
    """(busy, steal, total) CPU seconds of every CPU since boot (psutil's ``cpu_times``), or None.

    Total: every state but guest and guest_nice, which Linux already counts in user and nice (on
    Linux, /proc/stat's first eight fields: user nice system idle iowait irq softirq steal). Busy:
    neither idle nor iowait. Steal: None where the platform reports none."""
    try:
        times = psutil.cpu_times()
    except (OSError, RuntimeError, NotImplementedError):
        return None
    fields = times._asdict()
    total = sum(v for k, v in fields.items() if k not in ("guest", "guest_nice"))
    return total - fields["idle"] - fields.get("iowait", 0.0), fields.get("steal"), total


def _steal_and_total() -> tuple[float, float] | None:
    """(steal, total) CPU seconds of every CPU since boot, or None where the platform reports no steal."""
    times = _cpu_times()
    return None if times is None or times[1] is None else (times[1], times[2])


def _load() -> float | None:
    try:
        return psutil.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def _busy_and_total() -> tuple[float, float] | None:
    """(busy, total) CPU seconds of every CPU since boot (busy: neither idle nor iowait), or None."""
    times = _cpu_times()
    return None if times is None else (times[0], times[2])


def free_cores(sample_s: float = 0.25, cores: int | None = None) -> int:
    """The cores other work leaves free now: all of them, less the cores the machine was busy on
    over ``sample_s`` while this process slept (rounded; at least 1).

    The default intra-op thread count: torch's own default (one per core) collapses on a shared
    machine, because every OpenMP barrier waits for the thread the OS descheduled (measured on
    2 cores beside 2 CPU hogs: 39 tok/s at 2 threads, 583 at 1; idle, 1157 and 809). Where
    the platform reports no CPU times, every core counts as free.
    """
    cores = cores or os.cpu_count() or 1
    before = _busy_and_total()
    if before is None:
        return cores
    time.sleep(sample_s)
    after = _busy_and_total()
    if after is None or after[1] <= before[1]:
        return cores
    busy = cores * (after[0] - before[0]) / (after[1] - before[1])
    return max(1, min(cores, cores - round(busy)))


@dataclass
class Contention:
    cpu_share: float | None  # process CPU seconds / (busy wall seconds x threads asked for)
    cpu_util: float | None  # process CPU seconds / busy wall seconds (2.0: two cores the whole time)
    threads: int
    load_avg_before: float | None
    load_avg_after: float | None
    steal_frac: float | None
    wait_frac: float | None = None  # run-queue wait over busy wall time (None: no schedstat here)
    others_cpu: float | None = None  # cores' worth of CPU the rest of the machine used meanwhile
    cores: int | None = None

    @property
    def crowded(self) -> bool:
        """Other work and the measured threads together asked for more cores than the machine has
        (a process that hardly ran, waiting on something else, asked for none)."""
        if self.others_cpu is None or not self.cores or self.cpu_share is None or self.cpu_share < BUSY_SHARE:
            return False
        return self.threads + self.others_cpu > MAX_DEMAND * self.cores

    @property
    def starved(self) -> bool:
        if self.wait_frac is not None:
            return self.wait_frac > MAX_WAIT
        return self.cpu_share is not None and self.cpu_share < MIN_SHARE

    @property
    def contended(self) -> bool:
        return self.starved or self.crowded or (self.steal_frac is not None and self.steal_frac > MAX_STEAL)

    def note(self) -> str | None:
        if not self.contended:
            return None
        why = []
        if self.starved and self.wait_frac is not None:
            why.append(f"its threads waited for a free core {self.wait_frac:.0%} of the time"
                       + (f" and got {self.cpu_share:.0%} of the CPU {self.threads} thread(s) could use"
                          if self.cpu_share is not None else ""))
        elif self.starved:
            why.append(f"the process got {self.cpu_share:.0%} of the CPU its {self.threads} thread(s) could use")
        if self.crowded and not self.starved:
            why.append(f"other work used {self.others_cpu:.1f} of the {self.cores} cores beside its "
                       f"{self.threads} thread(s)")
        if self.steal_frac is not None and self.steal_frac > MAX_STEAL:
            why.append(f"steal took {self.steal_frac:.0%} of the machine")
        load = (f"; load average {self.load_avg_before:.1f} -> {self.load_avg_after:.1f}"
                if self.load_avg_before is not None and self.load_avg_after is not None else "")
        return f"contended: {' and '.join(why)}{load}: its times are the machine's, not the cache's"

    def as_row(self) -> dict:
        return {"cpu_util": self.cpu_util, "run_queue_wait_frac": self.wait_frac, "load_avg_before": self.load_avg_before,
                "load_avg_after": self.load_avg_after, "steal_frac": self.steal_frac, "others_cpu": self.others_cpu,
                "contended": self.contended}


class ContentionProbe:
    """``with ContentionProbe(threads) as probe: ...`` then ``probe.result(idle_s)``; wall time spent idle
    on purpose (waiting for arrivals) is left out of the share, as no CPU was asked for then."""

    def __init__(self, threads: int) -> None:
        self.threads = max(1, min(threads, os.cpu_count() or 1))

    def __enter__(self) -> ContentionProbe:
        self._load0, self._steal0, self._wait0 = _load(), _steal_and_total(), _run_queue_wait_s()
        self._busy0 = _busy_and_total()
        self._cpu0, self._wall0 = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self._cpu1, self._wall1 = time.process_time(), time.perf_counter()
        self._load1, self._steal1, self._wait1 = _load(), _steal_and_total(), _run_queue_wait_s()
        self._busy1 = _busy_and_total()

    def _others_cpu(self) -> float | None:
        """The machine's busy cores over the whole window, less this process's own (never below 0)."""
        wall = self._wall1 - self._wall0
        if self._busy0 is None or self._busy1 is None or wall <= 0.05:
            return None
        total = self._busy1[1] - self._busy0[1]
        if total <= 0:
            return None
        cores = os.cpu_count() or 1
        machine = cores * (self._busy1[0] - self._busy0[0]) / total
        return max(0.0, machine - (self._cpu1 - self._cpu0) / wall)

    def result(self, idle_s: float = 0.0) -> Contention:
        busy = self._wall1 - self._wall0 - idle_s
        cpu = self._cpu1 - self._cpu0
        util = cpu / busy if busy > 0.05 else None  # too short a window to say anything
        steal = None
        if self._steal0 is not None and self._steal1 is not None:
            total = self._steal1[1] - self._steal0[1]
            steal = (self._steal1[0] - self._steal0[0]) / total if total > 0 else None
        wait = None
        if util is not None and self._wait0 is not None and self._wait1 is not None:
            wait = max(0.0, self._wait1 - self._wait0) / busy
        return Contention(util / self.threads if util is not None else None, util, self.threads,
                          self._load0, self._load1, steal, wait, self._others_cpu() if util is not None else None,
                          os.cpu_count() or 1)


def probe_for(device_type: str) -> ContentionProbe | None:
    """A probe of the measured work on CPU, with torch's intra-op threads as what it asks for; None elsewhere
    (a GPU run's process mostly waits on the device, so its CPU share says nothing)."""
    if device_type != "cpu":
        return None
    import torch

    return ContentionProbe(torch.get_num_threads())


def with_contention(row: dict, contention: Contention) -> dict:
    """The row with the contention columns, and the note when its process did not get the CPU it asked for."""
    row.update(contention.as_row())
    if note := contention.note():
        row["notes"] = " | ".join(n for n in (row.get("notes"), note) if n)
    return row
