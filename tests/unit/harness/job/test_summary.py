"""The run summary printed after a job: one unit per column."""

from __future__ import annotations

from pathlib import Path

from harness.job.summary import print_summary


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
