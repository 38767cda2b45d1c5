"""Teacher-forced accuracy figures on hand-built distributions."""

from __future__ import annotations

import math

import pytest
import torch

from kvbench.harness.measure.accuracy import AccuracyTally, gate, kl_per_row, log_probs


def test_kl_of_known_distributions():
    p = torch.tensor([[0.5, 0.5], [0.9, 0.1]]).log()
    q = torch.tensor([[0.5, 0.5], [0.5, 0.5]]).log()
    kl = kl_per_row(p, q)
    assert kl[0] == pytest.approx(0.0, abs=1e-7)
    assert kl[1] == pytest.approx(0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5), rel=1e-6)


def test_the_tally_counts_top1_kl_and_the_fed_tokens_likelihood():
    torch.manual_seed(0)
    ref_logits = torch.randn(5, 11)
    logits = ref_logits.clone()
    logits[1] = -ref_logits[1]  # one row's favourite becomes its least likely token
    fed = torch.tensor([0, 3, 5, 7, 10])
    tally = AccuracyTally()
    tally.add(log_probs(ref_logits[:2]), logits[:2], fed[:2])  # two steps: sums over positions
    tally.add(log_probs(ref_logits[2:]), logits[2:], fed[2:])
    assert tally.positions == 5 and tally.top1_equal == 4 and tally.top1_agreement == 0.8
    ref_lp, lp = log_probs(ref_logits), log_probs(logits)
    assert tally.kl_mean == pytest.approx(float(kl_per_row(ref_lp, lp).mean()), rel=1e-6)
    assert tally.perplexity == pytest.approx(math.exp(-float(lp[torch.arange(5), fed].mean())), rel=1e-6)
    assert tally.ref_perplexity == pytest.approx(math.exp(-float(ref_lp[torch.arange(5), fed].mean())), rel=1e-6)


def test_bf16_logits_are_compared_in_float32():
    ref = torch.randn(3, 7, generator=torch.Generator().manual_seed(5))
    tally = AccuracyTally()
    tally.add(log_probs(ref), ref.to(torch.bfloat16), torch.tensor([1, 2, 3]))
    assert 0 <= tally.kl_mean < 1e-3 and tally.top1_agreement == 1.0


def test_gate():
    assert gate(0.995) == "pass" and gate(0.99) == "pass" and gate(0.989) == "fail" and gate(None) is None
    assert gate(0.9, threshold=0.85) == "pass"
    assert AccuracyTally().top1_agreement is None and AccuracyTally().perplexity is None
