"""workload.kind=system_prompt: a few system prompts, chosen by a Zipf popularity, before distinct user parts.

``system_prompts`` distinct prompts of ``system_prompt_len`` tokens each; request r picks prompt i
(ranked from 1) with probability proportional to ``i ** -zipf_exponent`` (0: uniform; larger: the
first prompt dominates), then appends a user part of its own, its length drawn like any workload's
prompt (``workload.prompt_len`` is the user part's mean). A request that would pass ``max_seq_len``
loses the tail of its user part (at least one token stays), then its output, and the notes count it.
"""

from __future__ import annotations

import numpy as np

from kvbench.harness.config import WorkloadConfig
from kvbench.harness.serving.request import Request, Workload, clip_note, draw_lengths, shared_ints

CHOICE_STREAM = 0x5157  # which system prompt each request takes: apart from lengths and token ids


def zipf_weights(count: int, exponent: float) -> np.ndarray:
    """The popularity of ranks 1..count, normalised to sum to 1."""
    w = np.arange(1, count + 1, dtype=np.float64) ** -exponent
    return w / w.sum()


def draw_system_prompt_workload(cfg: WorkloadConfig, num_requests: int, vocab: int, max_seq_len: int,
                                seed: int) -> Workload:
    rng = np.random.Generator(np.random.PCG64(seed))
    token_ids = shared_ints(vocab)
    systems = [token_ids(rng.integers(0, vocab, size=cfg.system_prompt_len)) for _ in range(cfg.system_prompts)]
    user_lens = draw_lengths(cfg, cfg.prompt_len, num_requests, rng)
    output_lens = draw_lengths(cfg, cfg.output_len, num_requests, rng, output=True)
    choice_rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, CHOICE_STREAM])))
    choice = choice_rng.choice(cfg.system_prompts, size=num_requests, p=zipf_weights(cfg.system_prompts,
                                                                                      cfg.zipf_exponent))
    requests, clipped, cut = [], 0, 0
    for rid in range(num_requests):
        system = systems[int(choice[rid])]
        user, out = int(user_lens[rid]), int(output_lens[rid])
        user_fit = max(1, min(user, max_seq_len - 1 - len(system)))
        out_fit = max(1, min(out, max_seq_len - len(system) - user_fit))
        clipped += (user_fit, out_fit) != (user, out)
        cut += user_fit < user
        prompt = system + token_ids(rng.integers(0, vocab, size=user_fit))
        requests.append(Request(rid, tuple(prompt), out_fit, cfg.n))
    return Workload(requests, clip_note(clipped, cut, num_requests, max_seq_len))
