"""``python -m harness.report`` with no folder: the user's own runs (runs/, single runs and sweeps alike), the
published report named beside them, and one line when there are no runs yet (harness/report/own_runs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbench.harness.report import DEFAULT_FOLDER, PUBLISHED_FOLDER
from kvbench.harness.report.__main__ import main
from kvbench.harness.report.own_runs import no_runs_line, published_line
from kvbench.harness.results import write_run


def decode_row(run_id: str, batch: int) -> dict:
    return {"run_id": run_id, "status": "ok", "device": "cpu", "device_slug": "cpu-test-2core", "scenario": "decode",
            "impl": "paged_torch", "model": "tiny-llama", "workload": "chat", "batch": batch,
            "output_tokens_per_s": 100.0 * batch, "tokens_per_s": 400.0 * batch, "step_ms_p50": 20.0,
            "kv_bytes_reserved": 2_000_000, "kv_bytes_used": 1_900_000, "kv_used_fraction": 0.95}


@pytest.fixture
def cwd(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)  # the report's default folder is relative, as Hydra's run folders are
    return tmp_path


def test_the_default_folder_is_where_runs_and_sweeps_land():
    from omegaconf import OmegaConf

    from kvbench.harness.paths import CONF_DIR

    hydra = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "config.yaml").hydra, resolve=False)  # ${now:} as text
    assert {Path(hydra["run"]["dir"]).parts[0], Path(hydra["sweep"]["dir"]).parts[0]} == {DEFAULT_FOLDER}
    assert PUBLISHED_FOLDER != DEFAULT_FOLDER


def test_no_runs_yet_is_one_line_pointing_to_the_quick_start_and_the_published_report(cwd, capsys):
    assert main([]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err == no_runs_line() + "\n" and err.count("\n") == 1
    assert "no runs yet under runs/" in err and "Quick start" in err and "python -m harness +impl=" in err
    assert "results/REPORT.md" in err and "python -m harness.report results/" in err
    assert not (cwd / DEFAULT_FOLDER).exists()  # nothing created


def test_a_runs_folder_without_rows_is_the_same_one_line(cwd, capsys):
    (cwd / "runs" / "2026-12-06" / "10-00-00").mkdir(parents=True)
    assert main([]) == 1
    assert capsys.readouterr().err == no_runs_line() + "\n"


def test_the_report_of_your_runs_reads_single_runs_and_sweeps_and_names_the_published_one(cwd, capsys):
    write_run(cwd / "runs" / "2026-12-06" / "10-00-00", [decode_row("single", 1)])
    for job, batch in ((0, 4), (1, 16)):
        write_run(cwd / "runs" / "sweeps" / "2026-12-06" / "10-05-00" / str(job), [decode_row(f"job{job}", batch)])
    assert main([]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("3 rows from 3 run folders")
    assert out[-2:] == ["report: runs/REPORT.md", published_line()]
    assert published_line() == ("published report: results/REPORT.md "
                                "(regenerate: python -m harness.report results/)")
    md = (cwd / "runs" / "REPORT.md").read_text()
    assert "```\npython -m harness.report\n```" in md  # what made it: the same command, no folder


def test_a_folder_named_is_reported_as_before_without_the_published_line(cwd, capsys):
    write_run(cwd / "mine" / "r", [decode_row("single", 1)])
    assert main(["mine"]) == 0
    out = capsys.readouterr().out
    assert "report: mine/REPORT.md" in out and "published report" not in out
