"""The report's KV data type section: each setting side by side at every kv_dtype it was measured at."""

from __future__ import annotations

import pandas as pd

from kvbench.harness.report.kv_dtype import capacity_table, decode_table, kv_dtype_section

BASE = {"status": "ok", "device_slug": "cpu-x", "model": "m", "dtype": "bfloat16", "impl": "paged_torch",
        "run_dir": "r"}


def _rows() -> pd.DataFrame:
    return pd.DataFrame([
        {**BASE, "scenario": "capacity", "kv_dtype": "auto", "kv_scale": None, "kv_bytes_per_token": 131072,
         "max_concurrency_analytic": 203},
        {**BASE, "scenario": "capacity", "kv_dtype": "fp8_e4m3", "kv_scale": "tensor", "kv_bytes_per_token": 65536,
         "max_concurrency_analytic": 406},
        {**BASE, "scenario": "capacity", "impl": "contiguous", "kv_dtype": "auto", "kv_bytes_per_token": 131072,
         "max_concurrency_analytic": 101},  # one dtype only: nothing to compare, left out
        {**BASE, "scenario": "decode", "workload": "text", "batch": 4, "kv_dtype": None, "step_ms_p50": 2.0,
         "prefill_step_ms_p50": 9.0, "kv_perplexity": 31.0},
        {**BASE, "scenario": "decode", "workload": "text", "batch": 4, "kv_dtype": "int8", "kv_scale": "token_head",
         "step_ms_p50": 2.5, "prefill_step_ms_p50": 12.0, "kv_top1_agreement": 0.995, "kv_kl_mean": 0.001,
         "kv_perplexity": 31.2, "kv_ref_perplexity": 31.0, "kv_accuracy_gate": "pass",
         "kv_accuracy_weights": "checkpoint"},
    ])


def test_capacity_shows_tokens_per_gb_per_dtype_auto_first():
    cap = capacity_table(_rows())
    assert list(cap["kv"]) == ["auto", "fp8_e4m3 (per tensor)"]
    assert list(cap["tokens_per_gb"]) == [7629, 15259] and list(cap["max_concurrency_analytic"]) == [203, 406]


def test_decode_puts_speed_and_accuracy_side_by_side_with_the_gate():
    dec = decode_table(_rows())
    assert list(dec["kv"]) == ["auto", "int8 (per token x head)"]  # a null kv_dtype is auto
    text = "\n".join(kv_dtype_section(_rows()))
    assert "## The KV cache's data type" in text
    assert "| int8 (per token x head) | 2.5 | 12 | 99.5% | 0.001 | 31.2 | 31 | pass | checkpoint |" in text


def test_no_section_without_two_dtypes():
    one = _rows().iloc[[2]]
    assert kv_dtype_section(one) == []
