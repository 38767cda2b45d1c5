"""``python -m harness.measure.steadiness [SECONDS] [WINDOW_S]``: how steady this machine's speed is, with nothing to
blame but the machine.

The CPU validation of the simulated clock (README "The simulated clock, validated") compares wall runs of 10-30 s
with a profile of the same process's steps. Its run-to-run spread is set by how the machine's speed moves in
between, so this probe times one fixed piece of work over and over, one intra-op thread, and prints each window's
median time against the whole run's: a loop of small torch ops like a tiny model's decode step (16 matmuls of a
row by 256 x 256, an activation, a norm: dispatch-bound, as the validation's steps are). A window at 1.8 is a few
seconds in which the same work took 1.8 times as long. The load average and the steal time (psutil) are printed
beside it: a spell with no load and no steal is the host's (a hypervisor's sibling threads, the shared cache),
which nothing inside the guest can see or correct.
"""

from __future__ import annotations

import statistics
import sys
import time

UNIT_REPEATS = 10  # a unit of work is about 6 ms on the 2-core machines here
WARM_UNITS = 100


def _unit(weights, row) -> float:
    import torch.nn.functional as F

    start = time.perf_counter()
    for _ in range(UNIT_REPEATS):
        h = row
        for w in weights:
            h = F.silu(h @ w) * 0.5 + h
            h = h / (h.norm() + 1)
    return time.perf_counter() - start


def windows(seconds: float, window_s: float, seed: int = 0) -> tuple[float, list[float]]:
    """(the median unit's seconds, each window's median unit over it), timing units for ``seconds``."""
    import torch

    if not (seconds > 0 and 0 < window_s <= seconds):
        raise ValueError(f"seconds={seconds}, window_s={window_s}: allowed: 0 < window_s <= seconds")
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(seed)
    weights = [torch.randn(256, 256, generator=gen) for _ in range(16)]
    row = torch.randn(1, 256, generator=gen)
    for _ in range(WARM_UNITS):
        _unit(weights, row)
    timed, t0 = [], time.perf_counter()
    while (now := time.perf_counter() - t0) < seconds:
        timed.append((now, _unit(weights, row)))
    base = statistics.median(t for _, t in timed)
    by_window: dict[int, list[float]] = {}
    for at, t in timed:
        by_window.setdefault(int(at // window_s), []).append(t / base)
    return base, [statistics.median(v) for _, v in sorted(by_window.items())]


def main(argv: list[str] | None = None) -> int:
    import psutil

    args = sys.argv[1:] if argv is None else argv
    try:
        seconds, window_s = (float(a) for a in (args + ["60", "2"][len(args):])[:2])
        if len(args) > 2:
            raise ValueError("too many arguments")
        steal0, load0 = getattr(psutil.cpu_times(), "steal", 0.0), psutil.getloadavg()[0]
        base, spread = windows(seconds, window_s)
    except ValueError as e:
        print(f"steadiness: {e}; usage: python -m harness.measure.steadiness [SECONDS=60] [WINDOW_S=2]",
              file=sys.stderr)
        return 2
    steal = getattr(psutil.cpu_times(), "steal", 0.0) - steal0
    print(f"unit {1e3 * base:.2f} ms (median); each {window_s:g} s window's median unit over it:")
    print(" ".join(f"{v:.2f}" for v in spread))
    print(f"slowest window {max(spread):.2f}, fastest {min(spread):.2f}; load average {load0:.2f} -> "
          f"{psutil.getloadavg()[0]:.2f}; steal {steal:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
