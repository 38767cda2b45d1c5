"""Seeded request generator shared by every impl: same seed, same requests, byte for byte."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np

from harness.config import WorkloadConfig
from harness.errors import ConfigError


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


def draw_lengths(cfg: WorkloadConfig, mean: float, count: int, rng: np.random.Generator) -> np.ndarray:
    if cfg.distribution == "fixed":
        return np.full(count, mean, dtype=np.int64)
    if cfg.distribution == "uniform":
        lo = max(1, round(mean * (1 - cfg.spread)))
        hi = max(lo, round(mean * (1 + cfg.spread)))
        return rng.integers(lo, hi + 1, size=count)
    # lognormal with the requested mean: mu = ln(mean) - sigma^2 / 2
    mu = np.log(mean) - cfg.sigma**2 / 2
    return np.maximum(1, np.rint(rng.lognormal(mu, cfg.sigma, size=count))).astype(np.int64)


_lengths = draw_lengths  # the name tests and older callers import


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


def _clip(p: int, o: int, max_seq_len: int) -> tuple[int, int]:
    """Clip the tail so prompt + output fits; keep at least one output token."""
    p = min(p, max_seq_len - 1)
    return p, max(1, min(o, max_seq_len - p))


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


def draw_workload(cfg: WorkloadConfig, num_requests: int, vocab_size: int, max_seq_len: int, seed: int,
                  model_path: str | None = None) -> Workload:
    """Draw ``num_requests`` requests; lengths come from ``cfg`` or, for ``distribution=trace``, its file
    (``distribution=text``: windows of a local text, tokenized by the checkpoint at ``model_path``).

    Long-tailed lengths are clipped to ``max_seq_len`` and counted in the notes. A fixed
    workload that cannot fit is a config error, not a silent clip.
    """
    total = cfg.prompt_len + cfg.output_len
    if cfg.distribution == "fixed" and total > max_seq_len:
        raise ConfigError(f"workload.prompt_len + workload.output_len = {total:g} exceeds max_seq_len={max_seq_len}")
    vocab = min(vocab_size, cfg.vocab_limit or vocab_size)
    if cfg.distribution == "text":
        from harness.serving.text_workload import text_windows  # the tokenizer only when asked for

        if total > max_seq_len:
            raise ConfigError(f"workload=text: workload.prompt_len + workload.output_len = {total:g} exceeds "
                              f"max_seq_len={max_seq_len}")
        text = text_windows(cfg.path, model_path, num_requests, int(cfg.prompt_len), int(cfg.output_len), vocab_size)
        return Workload(text.requests, text.notes, text.sha256, continuations=text.continuations)
    if cfg.kind == "multi_turn":  # its own modules, imported when asked for (they import this one)
        from harness.serving.conversations import draw_conversations

        return draw_conversations(cfg, vocab, max_seq_len, seed)
    if cfg.kind == "system_prompt":
        from harness.serving.system_prompts import draw_system_prompt_workload

        return draw_system_prompt_workload(cfg, num_requests, vocab, max_seq_len, seed)
    rng = np.random.Generator(np.random.PCG64(seed))
    trace = None
    if cfg.distribution == "trace":
        from harness.serving.trace import read_trace  # pandas and the file only when asked for

        trace = read_trace(cfg, num_requests, seed)
        prompt_lens, output_lens = trace.prompt_lens, trace.output_lens
    else:
        prompt_lens = draw_lengths(cfg, cfg.prompt_len, num_requests, rng)
        output_lens = draw_lengths(cfg, cfg.output_len, num_requests, rng)
    prefix = rng.integers(0, vocab, size=cfg.shared_prefix_len).tolist()
    token_ids = shared_ints(vocab)
    if trace is not None and trace.hash_ids is not None:
        from harness.serving.hash_blocks import HashBlockTokens

        blocks = HashBlockTokens(cfg.hash_block_size, vocab, seed, token_ids)
    requests, clipped, prompts_cut = [], 0, 0
    for rid in range(num_requests):
        want = int(max(prompt_lens[rid], cfg.shared_prefix_len + 1)), int(output_lens[rid])
        p, o = _clip(*want, max_seq_len)
        clipped += (p, o) != want
        prompts_cut += p < want[0]
        if trace is not None and trace.hash_ids is not None:  # format=mooncake: tokens from the block ids
            unique = blocks.prompt(trace.hash_ids[rid], p, rng)
        else:
            unique = token_ids(rng.integers(0, vocab, size=p - len(prefix)))
        requests.append(Request(rid, tuple(prefix + unique), o, cfg.n))
    return Workload(
        requests,
        clip_note(clipped, prompts_cut, num_requests, max_seq_len),
        trace.sha256 if trace else None,
        tuple(trace.arrival_s.tolist()) if trace is not None and trace.arrival_s is not None else None,
    )


def generate_requests(
    cfg: WorkloadConfig, num_requests: int, vocab_size: int, max_seq_len: int, seed: int
) -> list[Request]:
    """The requests of ``draw_workload``, without its notes."""
    return draw_workload(cfg, num_requests, vocab_size, max_seq_len, seed).requests


def workload_digest(requests: list[Request]) -> str:
    """A short hash of the exact requests, recorded in every row.

    An arrival at t=0 adds nothing to its request's record, so a burst hashes exactly as
    every run did before arrival times existed.
    """
    h = hashlib.sha256()
    for r in requests:
        record = [r.request_id, r.prompt_ids, r.output_len, r.n]
        h.update(json.dumps(record + [r.arrival_s] if r.arrival_s else record).encode())
    return h.hexdigest()[:16]
