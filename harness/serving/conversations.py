"""workload.kind=multi_turn: users in conversations of several turns, each prompt the whole history.

Turn k of a user: its prompt is turn k-1's prompt, turn k-1's answer and a new message, token for
token, so a prefix cache can serve every earlier turn of the conversation. The lengths of the new
messages and of the answers are drawn like any workload's (``workload.prompt_len``/``output_len``
with ``distribution``, ``sigma``, ``spread``).

The answers in the history are drawn token ids of the turn's output length, on both clocks: the
simulator generates no real tokens, and drawn ids keep every prompt fixed before the run, so both
clocks serve the very same requests (one workload digest) and the ideal hit rate is a function of the
workload alone. The price: the blocks a turn *generates* are not the ones its successor's prompt
holds, so only prompt blocks are reused (a real engine also reuses the generated ones).

A conversation that would outgrow ``max_seq_len`` ends early: its later turns are not sent, and the
workload's notes say how many. Request ids go turn by turn (every user's first turn, then every
user's second ...), one arrival order the closed loop can take. The think time before each later turn
(seconds from the previous answer's finish) comes from its own stream.
"""

from __future__ import annotations

import numpy as np

from kvbench.harness.config import WorkloadConfig
from kvbench.harness.serving.request import Request, Workload, draw_lengths, shared_ints

THINK_STREAM = 0x7A1C  # mixed with the seed: think times apart from the lengths and token ids


def think_times(cfg: WorkloadConfig, count: int, seed: int) -> np.ndarray:
    """``count`` think times in seconds, with mean ``cfg.think_time_s``."""
    if cfg.think_distribution == "fixed" or cfg.think_time_s == 0:
        return np.full(count, float(cfg.think_time_s))
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, THINK_STREAM])))
    return rng.exponential(cfg.think_time_s, size=count)


def draw_conversations(cfg: WorkloadConfig, vocab: int, max_seq_len: int, seed: int) -> Workload:
    """``cfg.users`` conversations of up to ``cfg.turns`` turns (fewer where ``max_seq_len`` ends one)."""
    users, turns = cfg.users, cfg.turns
    rng = np.random.Generator(np.random.PCG64(seed))
    message_lens = draw_lengths(cfg, cfg.prompt_len, users * turns, rng).reshape(users, turns)
    answer_lens = draw_lengths(cfg, cfg.output_len, users * turns, rng, output=True).reshape(users, turns)
    think = think_times(cfg, users * turns, seed).reshape(users, turns)
    token_ids = shared_ints(vocab)
    # (turn, user) -> (prompt, output length); drawn user by user, so a user's tokens do not depend on U
    drawn: dict[tuple[int, int], tuple[list[int], int]] = {}
    ended, dropped, first_clipped = 0, 0, 0
    for u in range(users):
        history: list[int] = []
        for t in range(turns):
            new = int(message_lens[u, t])
            out = int(answer_lens[u, t])
            if t == 0 and new + out > max_seq_len:  # a first turn is clipped like any request
                new = min(new, max_seq_len - 1)
                out = max(1, min(out, max_seq_len - new))
                first_clipped += 1
            if len(history) + new + out > max_seq_len:
                ended += 1
                dropped += turns - t
                break
            prompt = history + token_ids(rng.integers(0, vocab, size=new))
            drawn[t, u] = prompt, out
            history = prompt + token_ids(rng.integers(0, vocab, size=out))  # the answer, drawn
    requests: list[Request] = []
    per_user: list[list[int]] = [[] for _ in range(users)]
    think_s: list[float] = []
    for (t, u) in sorted(drawn):  # turn-major ids: every first turn, then every second ...
        prompt, out = drawn[t, u]
        per_user[u].append(len(requests))
        think_s.append(float(think[u, t]) if t else 0.0)
        requests.append(Request(len(requests), tuple(prompt), out))
    notes = []
    if first_clipped:
        notes.append(f"{first_clipped} of {users} first turns clipped to max_seq_len={max_seq_len}")
    if ended:
        notes.append(f"{ended} of {users} conversations ended early at max_seq_len={max_seq_len} "
                     f"({dropped} of {users * turns} turns not sent)")
    return Workload(requests, tuple(notes), conversations=tuple(tuple(ids) for ids in per_user),
                    think_s=tuple(think_s))
