"""How far a run's next-token distributions stay from a reference run's, position by position.

A quantized KV cache (or any change the model's output can feel) is judged against the same
requests at full precision, teacher-forced: both runs are fed the same tokens, so every position
compares like with like, and one early divergence does not turn the rest into a comparison of two
different texts (which is what the greedy prefix agreement of harness/measure/agreement.py
measures instead). Per position:

- top-1 agreement: the two runs' most likely next tokens are the same;
- KL(reference || run) of the two next-token distributions, in nats;
- the negative log-likelihood of the token actually fed next, for a perplexity when those tokens
  are a real text.

``AccuracyTally`` sums them over positions as they come, so nothing of size vocab x positions is
kept beyond the reference's own rows. ``gate`` turns the sums into a verdict in MLPerf's style: a
figure must reach a fixed share of the full-precision run's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

TOP1_GATE = 0.99  # MLPerf-style: teacher-forced top-1 agreement of at least 99% with the full-precision run


def log_probs(logits: torch.Tensor) -> torch.Tensor:
    """Rows of log-probabilities, in float32 whatever the model's dtype (bf16 logits would round the KL away)."""
    return torch.log_softmax(logits.float(), dim=-1)


def kl_per_row(ref_logp: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """KL(reference || run) per row, from log-probabilities; never negative (rounding clipped at 0)."""
    return (ref_logp.exp() * (ref_logp - logp)).sum(dim=-1).clamp_min(0.0)


@dataclass
class AccuracyTally:
    positions: int = 0
    top1_equal: int = 0
    kl_sum: float = 0.0
    nll_sum: float = 0.0  # of the tokens fed next, under the run
    ref_nll_sum: float = 0.0  # of the same tokens, under the reference

    def add(self, ref_logp: torch.Tensor, logits: torch.Tensor, next_tokens: torch.Tensor) -> None:
        """Rows of one step: the reference's log-probabilities, the run's logits, and the token each row was fed next."""
        logp = log_probs(logits).to(ref_logp.device)
        next_tokens = next_tokens.to(ref_logp.device).view(-1, 1)
        self.positions += logp.shape[0]
        self.top1_equal += int((logp.argmax(dim=-1) == ref_logp.argmax(dim=-1)).sum())
        self.kl_sum += float(kl_per_row(ref_logp, logp).sum())
        self.nll_sum += float(-logp.gather(1, next_tokens).sum())
        self.ref_nll_sum += float(-ref_logp.gather(1, next_tokens).sum())

    @property
    def top1_agreement(self) -> float | None:
        return self.top1_equal / self.positions if self.positions else None

    @property
    def kl_mean(self) -> float | None:
        return self.kl_sum / self.positions if self.positions else None

    @property
    def perplexity(self) -> float | None:
        return math.exp(self.nll_sum / self.positions) if self.positions else None

    @property
    def ref_perplexity(self) -> float | None:
        return math.exp(self.ref_nll_sum / self.positions) if self.positions else None


def gate(top1_agreement: float | None, threshold: float = TOP1_GATE) -> str | None:
    """``pass`` or ``fail`` against the threshold; None when nothing was compared."""
    if top1_agreement is None:
        return None
    return "pass" if top1_agreement >= threshold else "fail"
