"""Teacher-forced runs: a run under test fed a reference run's tokens, compared with it position by position.

The question a quantized KV cache raises is how far the model's next-token distributions move
from those of the same requests at full precision. Asked of two free-running greedy runs, it
stops meaning anything at the first divergence, since the two then continue different texts. So:

1. the reference run (full precision) serves the requests through the ordinary engine, greedily or
   fed given tokens (a real text), and keeps each position's log-probabilities (``Recording``);
2. the run under test serves the same requests fed the reference's tokens, and each of its
   positions is compared with the reference's same position (``Compared``) into an
   ``AccuracyTally`` (harness/measure/accuracy.py): top-1 agreement, KL, the tokens' likelihood.

Both go through the same scheduler, cache and kernels as a timed run; only the engine's sampler
differs (its ``sampler`` hook). Rows are keyed by (request, position): a preempted sequence's
recompute predicts its next position afresh, so the two runs need not batch alike.

The reference keeps positions x vocab log-probabilities in float32 on the host: ``MAX_REFERENCE_BYTES``
bounds that, and a larger ask is one line naming the sizes to reduce.
"""

from __future__ import annotations

from typing import Callable, Sequence as Seq

import torch

from kvbench.harness.errors import ConfigError
from kvbench.harness.measure.accuracy import AccuracyTally, log_probs
from kvbench.harness.serving.engine import Engine
from kvbench.harness.serving.sequence import Sequence
from kvbench.harness.serving.workload import Request

MAX_REFERENCE_BYTES = 2 * 2**30
Position = tuple[int, int]  # (request_id, index of the output token the logits predict)


class Recording:
    """The reference's sampler: greedy, or fed ``forced[request_id]``; keeps every position's log-probabilities."""

    def __init__(self, forced: dict[int, Seq[int]] | None = None) -> None:
        self.forced = forced
        self.rows: dict[Position, torch.Tensor] = {}

    def __call__(self, seqs: list[Sequence], logits: torch.Tensor) -> list[int]:
        logp = log_probs(logits).cpu()
        out = []
        for s, row in zip(seqs, logp):
            pos = len(s.output_ids)
            self.rows[(s.request_id, pos)] = row
            out.append(int(self.forced[s.request_id][pos]) if self.forced is not None else int(row.argmax()))
        return out


class Compared:
    """The run under test's sampler: fed the reference's tokens, each position tallied against the reference's."""

    def __init__(self, reference: dict[Position, torch.Tensor], tokens: dict[int, Seq[int]]) -> None:
        self.reference, self.tokens = reference, tokens
        self.tally = AccuracyTally()

    def __call__(self, seqs: list[Sequence], logits: torch.Tensor) -> list[int]:
        keys = [(s.request_id, len(s.output_ids)) for s in seqs]
        missing = [k for k in keys if k not in self.reference]
        if missing:
            raise RuntimeError(f"the reference run has no position {missing[0]}: the two runs served other requests")
        fed = [int(self.tokens[r][p]) for r, p in keys]
        self.tally.add(torch.stack([self.reference[k] for k in keys]), logits, torch.tensor(fed))
        return fed


def check_reference_size(requests: list[Request], vocab_size: int) -> None:
    positions = sum(r.output_len for r in requests)
    need = positions * vocab_size * 4
    if need > MAX_REFERENCE_BYTES:
        raise ConfigError(f"the accuracy check keeps {positions} positions x vocab {vocab_size} of float32 "
                          f"log-probabilities ({need / 2**30:.1f} GiB, over {MAX_REFERENCE_BYTES / 2**30:.0f} GiB): "
                          "lower workload.num_requests or workload.output_len")


EngineFactory = Callable[..., Engine]  # (sampler=...) -> an engine over a fresh cache


def compare(reference_engine: EngineFactory, test_engine: EngineFactory, requests: list[Request], vocab_size: int,
            forced: dict[int, Seq[int]] | None = None) -> tuple[AccuracyTally, dict[int, list[int]]]:
    """Serve ``requests`` on the reference (greedy, or fed ``forced``), then on the run under test fed the
    reference's tokens; the tally, and the tokens both runs were fed (the reference's greedy ones when not forced)."""
    if any(r.n != 1 for r in requests):
        raise ConfigError("the accuracy check compares one sequence per request: parallel sampling (n > 1) "
                          "is not supported there")
    check_reference_size(requests, vocab_size)
    recording = Recording(forced)
    result = reference_engine(sampler=recording).run(requests)
    tokens = {s.request_id: list(s.output_ids) for s in result.sequences}
    compared = Compared(recording.rows, tokens)
    test_engine(sampler=compared).run(requests)
    return compared.tally, tokens
