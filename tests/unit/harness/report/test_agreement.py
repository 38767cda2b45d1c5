"""The run folders' tokens.jsonl, as the report reads them for the prefix agreement."""

import json

from kvbench.harness.report.agreement import read_tokens


def test_read_tokens_reads_one_impls_records_and_skips_what_is_not_one(tmp_path):
    lines = [{"impl": "contiguous", "request_id": 0, "sample": 0, "output_ids": [1, 2]},
             {"impl": "paged_cuda", "request_id": 0, "sample": 0, "output_ids": [1, 3]},
             {"impl": "contiguous", "request_id": 1, "output_ids": "__import__('os')"}]
    (tmp_path / "tokens.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\nnot json\n")
    assert read_tokens(tmp_path, "contiguous") == {(0, 0): [1, 2]}
    assert read_tokens(tmp_path, "paged_cuda") == {(0, 0): [1, 3]}
    assert read_tokens(tmp_path, "paged_triton") is None and read_tokens(tmp_path / "none", "x") is None
