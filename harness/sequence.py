"""One generating sequence: a request's prompt plus the tokens produced so far."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(eq=False)
class Sequence:
    seq_id: int
    request_id: int
    sample: int  # index among the request's n parallel samples
    prompt_ids: tuple[int, ...] | list[int]  # the request's own tuple: never copied, never changed
    max_new_tokens: int
    output_ids: list[int] = field(default_factory=list)
    # Tokens whose K/V live in the cache (set by the cache on admission / append).
    num_cached: int = 0
    preempted: int = 0  # times preempted (recomputed)
    first_token_time: float | None = None

    @property
    def token_ids(self) -> list[int]:
        return [*self.prompt_ids, *self.output_ids]

    @property
    def last_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return len(self.output_ids) >= self.max_new_tokens

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - len(self.output_ids)
