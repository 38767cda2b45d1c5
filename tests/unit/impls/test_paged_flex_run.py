"""End to end on CPU: ``+impl=paged_flex`` runs (flex's eager path, kernel_backend flex-eager) and generates the
same greedy tokens as ``+impl=paged_torch``, the brief's command line in a job."""

from __future__ import annotations

import json
from pathlib import Path

from kvbench.harness.front.job import run_job

RUN = ["model=tiny-llama", "device=cpu", "batch=2", "workload=fixed", "workload.prompt_len=16",
       "workload.output_len=8", "max_seq_len=64"]


def _run(compose, tmp_path: Path, impl: str) -> tuple[dict, list[dict]]:
    out = tmp_path / impl
    rows, code = run_job(compose([f"+impl={impl}", *RUN]), out)
    assert code == 0, rows[0].get("error")
    (row,) = rows
    tokens = [json.loads(line) for line in (out / "tokens.jsonl").read_text().splitlines()]
    for t in tokens:
        t.pop("impl")
    return row, tokens


def test_paged_flex_generates_the_paged_torch_tokens(compose, tmp_path):
    ref_row, ref_tokens = _run(compose, tmp_path, "paged_torch")
    row, tokens = _run(compose, tmp_path, "paged_flex")
    assert row["status"] == "ok" and row["kernel"] == "flex" and row["kernel_backend"] == "flex-eager"
    assert len(tokens) == 2 and all(len(t["output_ids"]) == 8 for t in tokens), tokens
    assert tokens == ref_tokens and row["output_digest"] == ref_row["output_digest"]
