"""The run summary printed after a job: aligned columns, one unit per column, the figures the job is about."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvbench.harness.job.summary import print_summary


def test_byte_columns_are_gb_throughout(capsys):
    rows = [{"scenario": "decode", "impl": "a", "status": "ok", "kv_bytes_reserved": 2_500_000_000,
             "kv_bytes_used": 4096, "wall_s": 1.5},
            {"scenario": "decode", "impl": "b", "status": "ok", "kv_bytes_reserved": 123, "kv_bytes_used": None}]
    print_summary(rows, Path("runs/x"))
    header, a, b, where = capsys.readouterr().out.splitlines()
    cols = header.split()
    assert "kv_GB_reserved" in cols and "kv_bytes_reserved" not in cols
    i, j = cols.index("kv_GB_reserved"), cols.index("kv_GB_used")
    assert a.split()[i] == "2.5" and a.split()[j] == "4.096e-06"  # small and large in the same unit
    assert b.split()[i] == "1.23e-07" and b.split()[j] == "-"
    assert where == "results: runs/x"


def test_failed_rows_are_reported_on_stderr(capsys):
    print_summary([{"scenario": "decode", "impl": "a", "status": "error", "error": "ConfigError: bad"}], Path("r"))
    assert "a: error: ConfigError: bad" in capsys.readouterr().err


def test_columns_are_padded_to_one_width(capsys):
    rows = [{"scenario": "decode", "impl": "contiguous", "status": "ok", "wall_s": 12.25, "output_digest": "ab"},
            {"scenario": "decode", "impl": "paged_torch", "status": "ok", "wall_s": 0.5, "output_digest": "abcdef"}]
    print_summary(rows, Path("r"))
    header, a, b, _ = capsys.readouterr().out.splitlines()
    assert header.index("status") == a.index("ok") == b.index("ok")  # words: left-aligned under the header
    wall = header.index("wall_s") + len("wall_s")
    assert a[:wall].endswith("12.25") and b[:wall].endswith("0.5")  # numbers: right-aligned, digits lined up
    assert header.index("output_digest") == a.index("ab") == b.index("abcdef")


def service_row(impl: str, **extra) -> dict:
    return {"scenario": "decode", "impl": impl, "status": "ok", "arrival": "poisson", "clock": "wall",
            "request_rate": 20.0, "achieved_rps": 19.8, "ttft_ms_p50": 7.4, "ttft_ms_p99": 10.2, "tpot_ms_p50": 2.6,
            "tpot_ms_p99": 3.0, "e2el_ms_p50": 75.8, "e2el_ms_p99": 158.6, "output_tokens_per_s": 670.0,
            "preemptions": 0, "kv_bytes_reserved": 2_000_000, "max_concurrency": 8, **extra}


def test_a_service_run_shows_its_latency_percentiles_not_the_caches_size(capsys):
    print_summary([service_row("paged_torch"), service_row("contiguous", e2el_ms_p99=2345.0)], Path("r"))
    header, a, b, _ = capsys.readouterr().out.splitlines()
    cols = header.split()
    assert cols[:5] == ["impl", "status", "arrival", "clock", "request_rate"]
    assert {"ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99", "e2el_ms_p50"} <= set(cols)
    assert "kv_GB_reserved" not in cols and "max_concurrency" not in cols and "slo" not in cols  # no SLO was set
    i = cols.index("e2el_s_p99")  # 2345 ms: the column is shown in seconds, and says so
    assert a.split()[i] == "0.1586" and b.split()[i] == "2.345"


@pytest.mark.parametrize("arrival", ["gamma", "constant", "trace"])
def test_every_arrival_over_time_is_a_service_run_and_a_burst_is_not(capsys, arrival):
    print_summary([service_row("a", arrival=arrival)], Path("r"))
    assert "ttft_ms_p50" in capsys.readouterr().out.split()
    print_summary([service_row("a", arrival="burst")], Path("r"))
    cols = capsys.readouterr().out.splitlines()[0].split()
    assert "kv_GB_reserved" in cols and "ttft_ms_p50" not in cols  # the decode table: throughput and memory


def test_an_slo_run_shows_its_verdict(capsys):
    print_summary([service_row("a", slo="interactive", slo_pass=np.True_, slo_attainment=1.0, goodput_rps=19.8),
                   service_row("b", slo="interactive", slo_pass=False, slo_attainment=0.42, goodput_rps=8.3)],
                  Path("r"))
    header, a, b, _ = capsys.readouterr().out.splitlines()
    cols = header.split()
    assert cols[-4:] == ["slo", "slo_pass", "slo_attainment", "goodput_rps"]
    assert a.split()[-4:] == ["interactive", "yes", "1", "19.8"]
    assert b.split()[-4:] == ["interactive", "no", "0.42", "8.3"]


def test_numpy_numbers_are_numbers(capsys):
    """Rows read back from Parquet hold numpy scalars: np.int64 is no int, and bytes are still shown in GB."""
    print_summary([{"scenario": "capacity", "impl": "a", "status": "ok", "max_concurrency": np.int64(8),
                    "kv_bytes_reserved": np.int64(3_000_000_000)}], Path("r"))
    header, a, _ = capsys.readouterr().out.splitlines()
    assert dict(zip(header.split(), a.split())) == {"impl": "a", "status": "ok", "max_concurrency": "8",
                                                   "kv_GB_reserved": "3"}


def test_a_kernel_points_layout_tells_its_two_rows_apart(capsys):
    rows = [{"scenario": "kernel", "impl": "paged_torch", "layout": layout, "status": "ok", "latency_us_p50": us}
            for layout, us in (("paged", 2531.0), ("contiguous", 2265.0))]
    print_summary(rows, Path("r"))
    header, a, b, _ = capsys.readouterr().out.splitlines()
    assert header.split()[:3] == ["impl", "layout", "status"]
    assert a.split()[1] == "paged" and b.split()[1] == "contiguous"
