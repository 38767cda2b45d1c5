"""Prefix agreement: tokens equal up to each request's first divergence, over the reference's tokens."""

from kvbench.harness.measure.agreement import prefix_agreement


def test_agreement_counts_tokens_up_to_the_first_divergence_only():
    ref = {(0, 0): [1, 2, 3, 4], (1, 0): [5, 6, 7, 8, 9, 10]}
    other = {(0, 0): [1, 2, 9, 4], (1, 0): [5, 6, 7, 8, 9, 10]}  # request 0 diverges at its third token
    assert prefix_agreement(ref, other) == (2 + 6) / 10  # the equal 4th token after the divergence does not count
    assert prefix_agreement(ref, ref) == 1.0
    assert prefix_agreement(ref, {(0, 0): [7]}) == 0.0  # only the requests both have
    assert prefix_agreement(ref, {}) is None
