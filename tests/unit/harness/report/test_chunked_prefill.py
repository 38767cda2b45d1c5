"""The chunked-prefill section pairs the same requests served both ways, and only those."""

from __future__ import annotations

import pandas as pd

from kvbench.harness.report.chunked_prefill import CHUNKED_TITLE, chunked_pairs, chunked_section


def row(chunked: bool, rate: float, itl: float, digest: str = "d1", impl: str = "paged_torch") -> dict:
    return {"status": "ok", "scenario": "capacity", "device_slug": "cpu-x", "clock": "simulated",
            "clock_source": "roofline-v2", "model": "llama-3.1-8b", "dtype": "bfloat16", "impl": impl,
            "batch": 256, "max_seq_len": 16384, "block_size": 16, "workload_digest": digest, "request_rate": rate,
            "chunked_prefill": chunked, "max_num_batched_tokens": 2048 if chunked else 8192,
            "ttft_ms_p50": 100.0 + chunked, "ttft_ms_p99": 400.0, "tpot_ms_p50": 10.0, "tpot_ms_p99": 20.0,
            "itl_ms_p99": itl, "output_tokens_per_s": 500.0, "run_dir": f"r{rate}{chunked}{digest}"}


def test_pairs_by_everything_but_the_scheduling_keys():
    rows = pd.DataFrame([row(False, 2, 140.0), row(True, 2, 60.0), row(False, 1, 11.0), row(True, 1, 58.0),
                         row(True, 3, 66.0),  # no whole-prompt twin: not shown
                         row(False, 4, 500.0, digest="other"), row(True, 4, 70.0)])  # other requests: not a pair
    pairs = chunked_pairs(rows)
    assert pairs["request_rate"].tolist() == [1, 2]
    assert pairs["itl_ms_p99_whole"].tolist() == [11.0, 140.0] and pairs["itl_ms_p99_chunked"].tolist() == [58.0, 60.0]
    assert pairs["max_num_batched_tokens_chunked"].tolist() == [2048, 2048]
    text = "\n".join(chunked_section(rows))
    assert CHUNKED_TITLE in text and "| 2 | 2048 | 140.0 | 60.0 |" in text


def test_no_section_without_both_ways():
    assert chunked_section(pd.DataFrame([row(True, 2, 60.0)])) == []
    assert chunked_section(pd.DataFrame([{"status": "ok", "scenario": "kernel", "impl": "x", "run_dir": "r"}])) == []
