"""Prefix-cache reuse as a run achieves it: hit rate, blocks evicted, tokens recomputed after preemption.

A step observer (the simulator's and the decode engine's ``observer``): it reads what the scheduler
decided at each admission, so it needs nothing from the allocator but its eviction counter.

- ``prefix_hit_rate``: prompt tokens served from the prefix cache at each request's first admission,
  over the workload's prompt tokens, as the ideal rate counts them (a request rejected, or a turn never
  sent, hits nothing). vLLM's convention: a prompt's last token is always computed, so even a prompt
  seen before hits at most all but its last block. Hits when a preempted sequence is re-admitted are
  not prompt hits (``cache_hit_tokens`` counts every admission's). The steps table's rate is over the
  prompt tokens admitted so far.
- ``recomputed_tokens``: tokens a re-admission after a preemption computed again (not found cached).
- ``evicted_blocks``: cached blocks the allocator evicted to reuse their memory (None: it keeps none).

Both clocks count alike: one scheduler, one allocator (its host tier too) and this meter, and a multi-turn
history holds the same drawn answers on both (harness/serving/conversations.py; the blocks a turn generates,
the model's tokens or the simulator's, are hashed on both and hit by neither clock's next turn). So at
the same pool and the same arrival order (a think time of 0, or a burst) the wall and simulated clocks
give the same rate, hits, host hits and evictions (tests/unit/harness/serving/test_closed_loop.py); with
think time, when each turn arrives depends on each clock's step times. The pool is ``kv_pool_bytes`` over
``kv_bytes_per_token``: ``dtype=auto`` is float32 on a CPU and bfloat16 on a GPU, a simulated one
(``gpu=NAME``) included, so one ``device.kv_cache_gb`` holds twice the tokens in a simulated GPU run as in
a CPU wall-clock run. In a pool too small for a conversation's later turns, a turn is rejected and its
later turns are not sent (the row's notes count them): their prompt tokens hit nothing.
"""

from __future__ import annotations

from typing import Sequence as Seq

import pandas as pd

from kvbench.harness.serving.scheduler import StepPlan
from kvbench.harness.serving.sequence import Sequence
from kvbench.harness.serving.timeline import StepRecord

# The steps table's reuse columns, cumulative from the run's start up to and including each step.
STEP_COLUMNS = ["prefix_hit_tokens", "admitted_prompt_tokens", "prefix_hit_rate", "recomputed_tokens",
                "evicted_blocks"]


class ReuseMeter:
    def __init__(self, allocator) -> None:
        self.allocator = allocator
        self.hit_tokens = 0
        self.prompt_tokens = 0
        self.recomputed_tokens = 0
        self._steps: list[tuple[int, int, int, int | None]] = []

    @property
    def evicted_blocks(self) -> int | None:
        return getattr(self.allocator, "evicted_blocks", None)  # contiguous caches keep no blocks to evict

    def __call__(self, rec: StepRecord, plan: StepPlan, finished: Seq[Sequence]) -> None:
        for adm in plan.admitted:
            seq = adm.seq
            if seq.preempted:  # a recompute: its prompt was counted at its first admission
                self.recomputed_tokens += seq.num_tokens - seq.num_cached
            else:
                self.hit_tokens += seq.num_cached
                self.prompt_tokens += len(seq.prompt_ids)
        self._steps.append((self.hit_tokens, self.prompt_tokens, self.recomputed_tokens, self.evicted_blocks))

    @property
    def hit_rate(self) -> float | None:
        """Over the prompt tokens admitted."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else None

    def columns(self, ideal_rate: float | None, workload_prompt_tokens: int) -> dict:
        """The row's reuse columns; the hit rate over every prompt token of the workload."""
        rate = self.hit_tokens / workload_prompt_tokens if workload_prompt_tokens else None
        return {"prefix_hit_rate": rate, "prefix_hit_rate_ideal": ideal_rate,
                "recomputed_tokens": self.recomputed_tokens, "evicted_blocks": self.evicted_blocks}

    def add_step_columns(self, steps: pd.DataFrame) -> pd.DataFrame:
        """``steps`` (one row per record this meter observed, in order) with the reuse columns."""
        if len(steps) != len(self._steps):
            raise ValueError(f"{len(steps)} step rows for {len(self._steps)} observed records")
        cols = list(zip(*self._steps)) if self._steps else [[], [], [], []]
        hits, prompts, recomputed, evicted = (list(c) for c in cols)
        rate = [h / p if p else None for h, p in zip(hits, prompts)]
        return steps.assign(prefix_hit_tokens=hits, admitted_prompt_tokens=prompts, prefix_hit_rate=rate,
                            recomputed_tokens=recomputed, evicted_blocks=evicted)
