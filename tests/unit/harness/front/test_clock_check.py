"""The clock check's command line: its arguments, and the tables it writes."""

import csv

from kvbench.harness.front.clock_check import main
from tests.conftest import REPO_ROOT


def test_bad_arguments_exit_2_naming_the_value(tmp_path, capsys):
    assert main(["--cap", "0", "--csv", str(tmp_path / "e.csv"), "--md", str(tmp_path / "e.md")]) == 2
    assert "--cap=0" in capsys.readouterr().err
    assert main(["--only", "nope", "--csv", str(tmp_path / "e.csv"), "--md", str(tmp_path / "e.md")]) == 2
    assert "nope" in capsys.readouterr().err
    assert not (tmp_path / "e.md").exists()


def test_a_bad_set_exits_2(tmp_path, capsys):
    bad = tmp_path / "set.csv"
    bad.write_text("id,source_url\nx,https://a\n")
    assert main(["--set", str(bad), "--csv", str(tmp_path / "e.csv"), "--md", str(tmp_path / "e.md")]) == 2
    assert "missing columns" in capsys.readouterr().err


def test_only_the_chosen_points_are_written_with_the_unpriced_reason(tmp_path):
    ids = "q72-h100tp2-128-ttft,q72-h100tp2-128-tpot"
    published = (REPO_ROOT / "docs" / "validation" / "published_points.csv").read_text()
    (tmp_path / "set.csv").write_text(published.replace("qwen2.5-72b", "qwen9-999b"))  # no model conf: no run
    assert main(["--set", str(tmp_path / "set.csv"), "--only", ids, "--csv", str(tmp_path / "e.csv"),
                 "--md", str(tmp_path / "e.md")]) == 0
    rows = list(csv.DictReader(open(tmp_path / "e.csv")))
    assert [r["id"] for r in rows] == ids.split(",")
    assert all("qwen9-999b" in r["reason"] and r["simulated"] == "" for r in rows)
    text = (tmp_path / "e.md").read_text()
    assert "Priced 0 of 2 points." in text and "python -m harness.front.clock_check" in text
