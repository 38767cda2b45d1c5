"""A request and a run's workload of them, and the draws every workload kind shares.

Every kind of workload (harness/serving/workload.py's plain and trace draws, conversations.py,
system_prompts.py, text_workload.py) makes ``Request``s into a ``Workload``, its lengths from
``draw_lengths`` and its token ids as ``shared_ints``; here, so that workload.py can pick a kind's module
and the kinds' modules need not import it back.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvbench.harness.config import WorkloadConfig


@dataclass(frozen=True)
class Request:
    request_id: int
    prompt_ids: tuple[int, ...]
    output_len: int  # fixed: generation ignores EOS, as vLLM's benchmarks do
    n: int = 1  # parallel samples
    arrival_s: float = 0.0  # seconds after the run starts (harness/serving/arrivals.py); 0 in a burst

    @property
    def total_len(self) -> int:
        return len(self.prompt_ids) + self.output_len


def draw_lengths(cfg: WorkloadConfig, mean: float, count: int, rng: np.random.Generator,
                 output: bool = False) -> np.ndarray:
    """``count`` lengths of mean ``mean``; ``output``: outputs' (``workload.output_spread`` where set)."""
    if cfg.distribution == "fixed":
        return np.full(count, mean, dtype=np.int64)
    if cfg.distribution == "uniform":
        spread = cfg.output_spread if output and cfg.output_spread is not None else cfg.spread
        lo = max(1, round(mean * (1 - spread)))
        hi = max(lo, round(mean * (1 + spread)))
        return rng.integers(lo, hi + 1, size=count)
    # lognormal with the requested mean: mu = ln(mean) - sigma^2 / 2
    mu = np.log(mean) - cfg.sigma**2 / 2
    return np.maximum(1, np.rint(rng.lognormal(mu, cfg.sigma, size=count))).astype(np.int64)


@dataclass(frozen=True)
class Workload:
    """One run's requests (every ``arrival_s`` still 0) and what drawing them had to change."""

    requests: list[Request]
    notes: tuple[str, ...] = ()  # e.g. how many requests were clipped to max_seq_len
    trace_sha256: str | None = None  # workload=trace: the file's hash
    trace_arrivals: tuple[float, ...] | None = None  # workload=trace: the file's arrival times, per request
    # kind=multi_turn: each user's request ids in turn order, and each request's think time (seconds
    # after its predecessor's answer; 0 for first turns): the closed loop (harness/serving/closed_loop.py)
    conversations: tuple[tuple[int, ...], ...] | None = None
    think_s: tuple[float, ...] | None = None
    # distribution=text: each request's continuation in the text, the tokens a teacher-forced run is fed
    continuations: dict[int, tuple[int, ...]] | None = None
    # ``workload_digest(requests)``, where drawing the prompts made it from their ids while they were still
    # numpy's (100,000 chat prompts: about 1.5 s less than reading 51 million ints back); None: not made
    digest: str | None = None


def clip_note(clipped: int, prompts_cut: int, total: int, max_seq_len: int) -> tuple[str, ...]:
    if not clipped:
        return ()
    note = f"{clipped} of {total} requests clipped to max_seq_len={max_seq_len}"
    if prompts_cut:
        note += f" ({prompts_cut} with the prompt cut to leave 1 output token)"
    return (note,)


# Up to this many ids, a table of every token id's int object (8 MB of pointers at 1M ids);
# beyond it, only the ids drawn are interned, so a vocabulary of 1e9 never is materialised.
TOKEN_TABLE_MAX = 2**20


def shared_ints(vocab: int):
    """A function from drawn ids (a numpy array) to a list of ints in which each id is one shared object:
    100,000 chat prompts would otherwise hold ~50M separate ints (~1.8 GB)."""
    if vocab <= TOKEN_TABLE_MAX:
        table = np.arange(vocab).astype(object)
        return lambda ids: table[ids].tolist()
    seen: dict[int, int] = {}
    return lambda ids: [seen.setdefault(i, i) for i in ids.tolist()]
