"""The report's attention share section, from profile rows."""

from __future__ import annotations

import pandas as pd

from kvbench.harness.report.attention_share import attention_section, attention_table


def _rows(**extra) -> pd.DataFrame:
    base = {"scenario": "profile", "status": "ok", "device_slug": "cpu-x", "model": "tiny-llama", "dtype": "float32",
            "cpu_threads": 1, "run_dir": "r/0"}
    return pd.DataFrame([{**base, "impl": "paged_cuda", "attention_share_decode": 0.2,
                          "attention_share_decode_top": 0.55, "attention_share_prefill": 0.05, **extra},
                         {**base, "impl": "contiguous", "attention_share_decode": 0.3,
                          "attention_share_decode_top": 0.61, "attention_share_prefill": 0.07, **extra},
                         {**base, "scenario": "decode", "impl": "contiguous"}])


def test_each_profiled_impl_gets_its_shares_as_percentages():
    table = attention_table(_rows())
    assert list(table["impl"]) == ["contiguous", "paged_cuda"]  # only the profile rows, sorted
    text = "\n".join(attention_section(_rows()))
    assert "## Attention's share of a step" in text
    assert "| cpu-x | tiny-llama | float32 | paged_cuda | 1 | 20% | 55% | 5% |" in text


def test_no_section_without_timed_profile_rows():
    assert attention_section(_rows(attention_share_decode=None)) == []
    assert attention_section(_rows().drop(columns=["attention_share_prefill"])) == []
    assert attention_section(pd.DataFrame([{"scenario": "decode", "status": "ok"}])) == []
