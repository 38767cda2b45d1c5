"""Prefix agreement: tokens equal up to each request's first divergence, over the reference's tokens."""

import json

from harness.report.agreement import prefix_agreement, read_tokens


def test_agreement_counts_tokens_up_to_the_first_divergence_only():
    ref = {(0, 0): [1, 2, 3, 4], (1, 0): [5, 6, 7, 8, 9, 10]}
    other = {(0, 0): [1, 2, 9, 4], (1, 0): [5, 6, 7, 8, 9, 10]}  # request 0 diverges at its third token
    assert prefix_agreement(ref, other) == (2 + 6) / 10  # the equal 4th token after the divergence does not count
    assert prefix_agreement(ref, ref) == 1.0
    assert prefix_agreement(ref, {(0, 0): [7]}) == 0.0  # only the requests both have
    assert prefix_agreement(ref, {}) is None


def test_read_tokens_reads_one_impls_records_and_skips_what_is_not_one(tmp_path):
    lines = [{"impl": "contiguous", "request_id": 0, "sample": 0, "output_ids": [1, 2]},
             {"impl": "paged_cuda", "request_id": 0, "sample": 0, "output_ids": [1, 3]},
             {"impl": "contiguous", "request_id": 1, "output_ids": "__import__('os')"}]
    (tmp_path / "tokens.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\nnot json\n")
    assert read_tokens(tmp_path, "contiguous") == {(0, 0): [1, 2]}
    assert read_tokens(tmp_path, "paged_cuda") == {(0, 0): [1, 3]}
    assert read_tokens(tmp_path, "paged_triton") is None and read_tokens(tmp_path / "none", "x") is None
