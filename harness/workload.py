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

    @property
    def total_len(self) -> int:
        return len(self.prompt_ids) + self.output_len


def _lengths(cfg: WorkloadConfig, mean: int, count: int, rng: np.random.Generator) -> np.ndarray:
    if cfg.distribution == "fixed":
        return np.full(count, mean, dtype=np.int64)
    if cfg.distribution == "uniform":
        lo = max(1, round(mean * (1 - cfg.spread)))
        hi = max(lo, round(mean * (1 + cfg.spread)))
        return rng.integers(lo, hi + 1, size=count)
    # lognormal with the requested mean: mu = ln(mean) - sigma^2 / 2
    mu = np.log(mean) - cfg.sigma**2 / 2
    return np.maximum(1, np.rint(rng.lognormal(mu, cfg.sigma, size=count))).astype(np.int64)


def generate_requests(
    cfg: WorkloadConfig, num_requests: int, vocab_size: int, max_seq_len: int, seed: int
) -> list[Request]:
    """Draw ``num_requests`` requests; long-tailed lengths are clipped to ``max_seq_len``.

    A fixed workload that cannot fit is a config error, not a silent clip.
    """
    if cfg.distribution == "fixed" and cfg.prompt_len + cfg.output_len > max_seq_len:
        raise ConfigError(
            f"workload.prompt_len + workload.output_len = {cfg.prompt_len + cfg.output_len} "
            f"exceeds max_seq_len={max_seq_len}"
        )
    vocab = min(vocab_size, cfg.vocab_limit or vocab_size)
    rng = np.random.Generator(np.random.PCG64(seed))
    prompt_lens = _lengths(cfg, cfg.prompt_len, num_requests, rng)
    output_lens = _lengths(cfg, cfg.output_len, num_requests, rng)
    prefix = rng.integers(0, vocab, size=cfg.shared_prefix_len).tolist()
    # One int object per token id, shared by every prompt: 100,000 chat prompts would
    # otherwise hold ~50M separate ints (~1.8 GB).
    token = np.arange(vocab).astype(object)
    requests = []
    for rid in range(num_requests):
        p = int(max(prompt_lens[rid], cfg.shared_prefix_len + 1))
        o = int(output_lens[rid])
        # Clip the tail so prompt + output fits; keep at least one output token.
        p = min(p, max_seq_len - 1)
        o = max(1, min(o, max_seq_len - p))
        unique = token[rng.integers(0, vocab, size=p - len(prefix))].tolist()
        requests.append(Request(rid, tuple(prefix + unique), o, cfg.n))
    return requests


def workload_digest(requests: list[Request]) -> str:
    """A short hash of the exact requests, recorded in every row."""
    h = hashlib.sha256()
    for r in requests:
        h.update(json.dumps([r.request_id, r.prompt_ids, r.output_len, r.n]).encode())
    return h.hexdigest()[:16]
