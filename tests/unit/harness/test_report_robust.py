"""The report survives bad run folders (corrupt, empty, incomplete) and marks noisy repeats."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from kvbench.harness.report import build_report
from kvbench.harness.report.__main__ import main
from kvbench.harness.report.collect import collect
from kvbench.harness.results import write_run

ENV = {"device": "cpu", "device_slug": "cpu-test", "cpu_name": "Test CPU", "status": "ok", "scenario": "decode",
       "model": "tiny-llama", "workload": "chat", "batch": 4}


def decode(impl: str, tps: float, spread: float = 0.0, repeat: int = 3) -> dict:
    return {**ENV, "impl": impl, "repeat": repeat, "tokens_per_s": tps, "output_tokens_per_s": tps / 2,
            "tokens_per_s_spread": spread}


def points() -> pd.DataFrame:
    return pd.DataFrame([{"concurrency": c, "variant": v, "model": "tiny-llama", "workload": "chat",
                          "kv_bytes_reserved": c * k, "kv_bytes_used": c, "budget_kv_bytes": 1e6}
                         for c in (1, 2) for v, k in (("contiguous", 4.0), ("paged", 1.0))])


def test_corrupt_parquet_falls_back_to_csv(tmp_path, capsys):
    write_run(tmp_path / "runs" / "good", [decode("contiguous", 100.0)])
    write_run(tmp_path / "runs" / "corrupt", [decode("paged_torch", 123.0)])
    write_run(tmp_path / "runs" / "empty", [decode("paged_triton", 77.0)])
    (tmp_path / "runs" / "corrupt" / "rows.parquet").write_bytes(b"PAR1 not really a parquet file")
    (tmp_path / "runs" / "empty" / "rows.parquet").write_bytes(b"")
    out = tmp_path / "out"
    assert main([str(tmp_path / "runs"), "--out", str(out)]) == 0
    df = pd.read_parquet(out / "all_runs.parquet").set_index("impl")
    assert df.loc["paged_torch", "tokens_per_s"] == 123.0 and df.loc["paged_triton", "tokens_per_s"] == 77.0
    err = capsys.readouterr().err
    for name in ("corrupt", "empty"):
        assert f"warning: {tmp_path / 'runs' / name / 'rows.parquet'}: unreadable (" in err
    assert err.count("read rows.csv instead") == 2
    md = (out / "REPORT.md").read_text()
    assert "`runs/corrupt/rows.parquet`" in md and "read `rows.csv` instead" in md


def test_unreadable_tables_listed_and_the_rest_reported(tmp_path, capsys):
    write_run(tmp_path / "runs" / "good", [decode("contiguous", 100.0)], {"points": points()})
    bad = tmp_path / "runs" / "bad"
    write_run(bad, [decode("paged_torch", 123.0)])
    (bad / "rows.parquet").write_bytes(b"\x00garbage")
    (bad / "rows.csv").write_text("impl,status\npaged_torch,ok,1,2,3\n\"unclosed\n")
    (tmp_path / "runs" / "good" / "points.parquet").write_bytes(b"")  # a side table, without a readable twin
    (tmp_path / "runs" / "good" / "points.csv").unlink()
    out = tmp_path / "out"
    assert main([str(tmp_path / "runs"), "--out", str(out)]) == 0
    rows = pd.read_parquet(out / "all_runs.parquet")
    assert rows["impl"].tolist() == ["contiguous"]
    err = capsys.readouterr().err
    for path in (bad / "rows.parquet", bad / "rows.csv", tmp_path / "runs" / "good" / "points.parquet"):
        assert f"warning: {path}: unreadable (" in err and f"{path}: unreadable" in err
    assert err.count("left out") == 3
    md = (out / "REPORT.md").read_text()
    assert "## Run folders not fully read" in md
    for label in ("runs/bad/rows.parquet", "runs/bad/rows.csv", "runs/good/points.parquet"):
        assert f"`{label}`" in md
    # the good folder's one decode row is one point: its section is a table row, named, not a figure
    assert not (out / "plots" / "decode_throughput.png").exists() and "one batch only" in md
    assert not (out / "plots" / "memory_vs_concurrency.png").exists()  # its only table was unreadable


def test_incomplete_folders_listed(tmp_path, capsys):
    runs = tmp_path / "runs"
    write_run(runs / "sweep" / "0", [decode("contiguous", 100.0)])
    (runs / "sweep" / "0" / ".hydra").mkdir()
    (runs / "sweep" / "0" / ".hydra" / "config.yaml").write_text("batch: 4\n")  # Hydra's own copy: not a run
    (runs / "sweep" / "0" / "config.yaml").write_text("batch: 4\n")
    (runs / "sweep" / "1").mkdir()
    (runs / "sweep" / "1" / "config.yaml").write_text("batch: 8\n")  # killed before any row
    (runs / "sweep" / "2").mkdir()
    (runs / "sweep" / "2" / "config.yaml").write_text("batch: 16\n")
    (runs / "sweep" / "2" / "rows.csv").write_text("")  # killed while writing its first row
    col = collect([runs])
    assert [label for label, _ in col.incomplete] == ["runs/sweep/1", "runs/sweep/2"]
    assert main([str(runs), "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert f"warning: {runs / 'sweep' / '1'}: incomplete (a run folder without rows)" in err
    assert f"warning: {runs / 'sweep' / '2'}: incomplete" in err and "sweep/0:" not in err
    md = (tmp_path / "out" / "REPORT.md").read_text()
    assert "Incomplete run folders" in md and "- `runs/sweep/1`" in md and "- `runs/sweep/2`" in md
    assert "- `runs/sweep/0`" not in md


def test_only_unreadable_folders_fail_naming_them(tmp_path, capsys):
    (tmp_path / "runs" / "x").mkdir(parents=True)
    (tmp_path / "runs" / "x" / "rows.parquet").write_bytes(b"")
    (tmp_path / "runs" / "y").mkdir()
    (tmp_path / "runs" / "y" / "config.yaml").write_text("batch: 1\n")
    assert main([str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "1 unreadable tables, 1 incomplete folders" in err
    assert f"{tmp_path / 'runs' / 'x' / 'rows.parquet'}: unreadable" in err and f"{tmp_path / 'runs' / 'y'}: incomplete" in err


@pytest.fixture
def noisy(tmp_path) -> Path:
    write_run(tmp_path / "runs" / "d", [decode("contiguous", 100.0, spread=0.049),
                                        decode("paged_torch", 200.0, spread=0.051),
                                        decode("paged_triton", 300.0, spread=None, repeat=1)])
    return tmp_path


def _decode_lines(md: str) -> dict[str, str]:
    # the pure-torch reference is marked as one in the speed tables: "paged_torch (reference)"
    return {impl: next(ln for ln in md.splitlines() if ln.startswith(f"| cpu-test | tiny-llama | chat | {impl} |")
                       or ln.startswith(f"| cpu-test | tiny-llama | chat | {impl} (reference) |"))
            for impl in ("contiguous", "paged_torch", "paged_triton")}


@pytest.mark.parametrize("bound, marked", [(None, {"paged_torch"}), ("10%", set()), ("0.01", {"contiguous", "paged_torch"}),
                                           ("0.051", set())])
def test_spread_beyond_the_bound_is_marked(noisy, bound, marked):
    out = noisy / "out"
    assert main([str(noisy / "runs"), "--out", str(out), *(["--max-spread", bound] if bound else [])]) == 0
    md = (out / "REPORT.md").read_text()
    lines = _decode_lines(md)
    assert {impl for impl, ln in lines.items() if "†" in ln} == marked
    if "paged_torch" in marked:
        assert "| 100 † | 200 † | 0.051 † |" in lines["paged_torch"]  # output tok/s, tok/s and the spread itself
    assert ("† " + f"{len(marked)} row" in md) == bool(marked)
    assert "| 50 | 100 |" in lines["contiguous"] or "contiguous" in marked


@pytest.mark.parametrize("bad", ["-0.1", "abc", "nan", "inf"])
def test_bad_max_spread_is_a_usage_error(noisy, bad, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([str(noisy / "runs"), "--max-spread", bad])
    assert exit_.value.code == 2 and "--max-spread" in capsys.readouterr().err


def test_build_report_takes_the_bound(noisy):
    report = build_report([noisy / "runs"], noisy / "out", "cmd", max_spread=0.5)
    assert "†" not in (noisy / "out" / "REPORT.md").read_text()
    with pytest.raises(ValueError, match="max_spread"):
        build_report([noisy / "runs"], noisy / "out", "cmd", max_spread=-1)
    assert report.files and "## 1. Decode throughput vs batch" in (noisy / "out" / "REPORT.md").read_text()


def _csv_only(folder: Path) -> Path:
    (folder / "rows.parquet").unlink()
    return folder / "rows.csv"


@pytest.mark.parametrize("damage, kept, says", [
    # a garbage line appended to the CSV: no scenario, no known status
    (lambda f: _csv_only(f).open("a").write("garbage,,,,\n"), 1, "empty scenario/status"),
    (lambda f: _csv_only(f).open("a").write("\n\n%%%\n"), 1, "rows not read"),
    # a row whose status is no status kvbench writes
    (lambda f: write_run(f, [decode("paged_torch", 1.0), {**decode("paged_cuda", 2.0), "status": "bogus_status"}]), 1,
     "'bogus_status' is not one of"),
    # a row with no scenario
    (lambda f: write_run(f, [decode("paged_torch", 1.0), {**decode("paged_cuda", 2.0), "scenario": None}]), 1,
     "empty scenario/status"),
    # a rows table of another schema altogether
    (lambda f: (pd.DataFrame({"foo": [1, 2], "bar": ["x", "y"]}).to_parquet(f / "rows.parquet"),
                (f / "rows.csv").unlink()), 0, "no scenario, status column"),
])
def test_rows_that_are_not_kvbench_rows_are_warned_listed_and_left_out(tmp_path, capsys, damage, kept, says):
    write_run(tmp_path / "runs" / "good", [decode("contiguous", 100.0)])
    bad = tmp_path / "runs" / "bad"
    write_run(bad, [decode("paged_torch", 1.0)])
    damage(bad)
    out = tmp_path / "out"
    assert main([str(tmp_path / "runs"), "--out", str(out)]) == 0
    df = pd.read_parquet(out / "all_runs.parquet")
    assert set(df["status"]) == {"ok"} and df["scenario"].notna().all()  # no row with empty identifiers
    assert (df["run_dir"] == "runs/bad").sum() == kept and (df["run_dir"] == "runs/good").sum() == 1
    assert "status" in df.columns and not [c for c in df.columns if c.startswith("bogus")]
    err = capsys.readouterr().err
    assert "warning:" in err and "rows not read" in err and says in err
    assert "rows not read" in (out / "REPORT.md").read_text()
