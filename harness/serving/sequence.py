"""One generating sequence: a request's prompt plus the tokens produced so far."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence as Seq


# slots: a 100,000-request simulation keeps every finished sequence (no per-object __dict__)
@dataclass(eq=False, slots=True)
class Sequence:
    seq_id: int
    request_id: int
    sample: int  # index among the request's n parallel samples
    prompt_ids: tuple[int, ...] | list[int]  # the request's own tuple: never copied, never changed
    output_len: int
    output_ids: list[int] = field(default_factory=list)
    # Leading tokens whose K/V were already in the cache at its latest admission (prefix-cache
    # hits): the prefill computes from here. A recompute after a preemption re-admits the prompt
    # and the outputs so far, so hits may reach past the prompt. Set by the scheduler from the
    # allocator's ``admit``; 0 while preempted.
    num_cached: int = 0
    # chunked_prefill: tokens whose K/V this admission's prefill has computed so far (from ``num_cached``
    # up to ``num_tokens``, one chunk a step); the plain scheduler computes a prompt in one step.
    num_computed: int = 0
    preempted: int = 0  # times preempted (recomputed)
    # Service timeline, in seconds on the run's clock (wall or simulated), from its start.
    arrival_s: float = 0.0
    admitted_s: float | None = None  # when the step that first admitted it started (a recompute keeps it)
    first_token_s: float | None = None
    finish_s: float | None = None  # when its last token was made
    # When each output token was made: the decode engine keeps them (ITL per sequence); the
    # simulator does not (it jumps many steps at once) and gives ITL from its step records.
    token_s: list[float] = field(default_factory=list)

    @property
    def token_ids(self) -> Seq[int]:
        """The prompt, then the outputs so far: to read, not to change (before the first output, the prompt
        itself, not a copy: the scheduler plans a waiting request's admission at every step it waits)."""
        return [*self.prompt_ids, *self.output_ids] if self.output_ids else self.prompt_ids

    @property
    def last_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return len(self.output_ids) >= self.output_len

    @property
    def total_len(self) -> int:
        """Tokens once finished: prompt plus every output token (output lengths are fixed)."""
        return len(self.prompt_ids) + self.output_len

    @property
    def remaining(self) -> int:
        return self.output_len - len(self.output_ids)
