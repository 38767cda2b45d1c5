"""A results folder is data (SECURITY.md): no code runs, nothing outside it is read, written or deleted, nothing
it holds blocks or exhausts kvbench, and what REPORT.md and the CSVs take from it is escaped at the output.

Each class has the issue's reproducer and variants a narrow fix would miss (other fields, entry points, file kinds).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from kvbench.harness.job.folder import RunFolder, table_names
from kvbench.harness.report import build_report
from kvbench.harness.report.collect import collect
from kvbench.harness.report.stale import code_changes_since
from kvbench.harness.report.tables import cell, md_code, md_fence, md_text
from kvbench.harness.results import csv_cell, write_json, write_run, write_table
from kvbench.harness.untrusted import (UntrustedError, bare_name, inside, load_yaml, own_subfolder, read_bytes, read_json,
                               read_table, read_yaml)
from kvbench.harness.untrusted.git import committed_unchanged, git, is_object_id

ROW = {"device": "cpu", "device_slug": "cpu-test", "cpu_name": "Test CPU", "status": "ok", "scenario": "decode",
       "model": "tiny-llama", "workload": "chat", "batch": 4, "impl": "contiguous", "tokens_per_s": 10.0,
       "output_tokens_per_s": 5.0}
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join(['*' + p] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi"))


def _git(*args, cwd):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def _planted_repository(folder: Path, marker: Path) -> None:
    """A repository in ``folder`` whose config and attributes run a command (touching ``marker``) through each of
    git's hooks into a working tree: the fsmonitor, a clean filter, a diff driver and a textconv."""
    _git("init", "-q", cwd=folder)
    cmd = f"touch {marker}; false"
    for key, value in (("core.fsmonitor", cmd), ("filter.x.clean", cmd), ("filter.x.smudge", cmd),
                       ("diff.x.command", cmd), ("diff.x.textconv", cmd), ("core.pager", cmd)):
        _git("config", key, value, cwd=folder)
    (folder / ".gitattributes").write_text("* filter=x diff=x\n")
    _git("add", "-A", cwd=folder)
    _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "planted", cwd=folder)
    marker.unlink(missing_ok=True)  # the commit itself ran the filter: only what kvbench runs counts


# --- code never runs: git is asked about the checkout, from its root --------------------------------------------

def test_a_run_folder_holding_its_own_repository_runs_nothing(tmp_path):
    folder, marker = tmp_path / "run", tmp_path / "ran"
    folder.mkdir()
    write_run(folder, [ROW])
    write_json(folder / "job.json", {"job_id": "j", "device_slug": "cpu-test", "tables": []})
    _planted_repository(folder, marker)
    assert RunFolder(folder).shipped() is False  # its repository is not kvbench's checkout: not published rows
    assert committed_unchanged(folder / "rows.csv", repo=folder.parent) is False  # no repository there either
    assert not marker.exists()


def test_resuming_a_run_folder_that_holds_a_planted_repository_runs_nothing(compose, tmp_path):
    """The issue's reproducer, through the job as ``kvbench ... hydra.run.dir=<it> resume=true`` runs it."""
    from kvbench.harness.front.job import run_job

    cfg = ["+impl=paged_torch", "scenario=capacity", "model=tiny-llama", "device=cpu", "workload.num_requests=4",
           "scenario.concurrency_points=[1,2]"]
    folder, marker = tmp_path / "run", tmp_path / "ran"
    first, code = run_job(compose(cfg), folder)
    assert code == 0
    _planted_repository(folder, marker)
    again, code = run_job(compose([*cfg, "resume=true"]), folder)
    assert code == 0 and all(r.get("_kept") for r in again)  # this machine's rows, kept; nothing ran
    assert not marker.exists()


def test_the_checkout_is_asked_from_its_root_whatever_the_working_directory(tmp_path, monkeypatch):
    checkout, marker = tmp_path / "checkout", tmp_path / "ran"
    checkout.mkdir()
    (checkout / "f.txt").write_text("x\n")
    _git("init", "-q", cwd=checkout)
    _git("add", "-A", cwd=checkout)
    _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c", cwd=checkout)
    planted = tmp_path / "elsewhere"
    planted.mkdir()
    (planted / "g.txt").write_text("y\n")
    _planted_repository(planted, marker)
    monkeypatch.chdir(planted)  # the user runs kvbench from inside a downloaded folder
    monkeypatch.setenv("GIT_DIR", str(planted / ".git"))  # and an inherited GIT_DIR changes nothing either
    assert committed_unchanged(checkout / "f.txt", repo=checkout)
    (checkout / "f.txt").write_text("changed\n")
    assert not committed_unchanged(checkout / "f.txt", repo=checkout)
    assert not committed_unchanged(planted / "g.txt", repo=checkout)  # outside the checkout: git is not asked
    assert git("rev-parse", "HEAD", repo=checkout).stdout.strip() != git("rev-parse", "HEAD", repo=planted).stdout.strip()
    assert not marker.exists()


@pytest.mark.parametrize("sha", ["--output=OUT", "-o", "HEAD~1", "abc;touch x", "A" * 40, "", None, 7])
def test_a_rows_git_sha_never_becomes_a_git_option(tmp_path, monkeypatch, sha):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "OUT"
    if isinstance(sha, str):
        sha = sha.replace("OUT", str(out))
    assert not is_object_id(sha)
    if isinstance(sha, str) and sha:
        assert "not a commit id" in code_changes_since(sha)
    assert not out.exists()


# --- nothing outside the folder is deleted, written or read -------------------------------------------------------

@pytest.mark.parametrize("name", ["../victim/p", "/ABS/victim/p", "..", "a/../../victim/p", "sub/p", "", 5, None,
                                  "p\n", "."])
def test_job_json_tables_are_bare_names_only(tmp_path, name):
    victim = tmp_path / "victim"
    victim.mkdir()
    for suffix in (".csv", ".parquet"):
        (victim / f"p{suffix}").write_text("precious")
    folder = tmp_path / "run"
    folder.mkdir()
    name = name.replace("/ABS", str(tmp_path)) if isinstance(name, str) else name
    write_json(folder / "job.json", {"job_id": "j", "device_slug": "cpu-test", "tables": [name, "points"]})
    assert table_names(RunFolder(folder).job()) == ["points"]
    RunFolder(folder).claim("j", "cpu-test", resume=False)  # a fresh start clears the earlier attempt's tables
    RunFolder(folder).claim("j", "cpu-test", resume=True)
    assert all((victim / f"p{s}").read_text() == "precious" for s in (".csv", ".parquet"))


def test_a_job_json_that_is_not_a_record_is_no_job(tmp_path):
    for text in ("[1, 2]", '{"job_id": 5}', '{"job_id": ""}', "not json", '{"job_id": "j", "tables": "../x"}'):
        (tmp_path / "job.json").write_text(text)
        job = RunFolder(tmp_path).job()
        assert job is None or table_names(job) == []


def test_a_planted_lock_link_never_truncates_what_it_points_to(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / ".kvbench.lock").symlink_to(victim)
    with RunFolder(folder).locked():
        pass
    assert victim.read_text() == "precious"


def test_tables_and_records_written_over_planted_links_replace_the_link(tmp_path):
    victim = tmp_path / "victim.csv"
    victim.write_text("precious")
    folder = tmp_path / "run"
    folder.mkdir()
    for name in ("rows.csv", "rows.parquet", "job.json", "REPORT.md"):
        (folder / name).symlink_to(victim)
    write_run(folder, [ROW])
    write_json(folder / "job.json", {"job_id": "j"})
    assert victim.read_text() == "precious" and not (folder / "rows.csv").is_symlink()


def test_a_planted_subfolder_link_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / ".hydra").symlink_to(outside)
    with pytest.raises(UntrustedError, match="symbolic link"):
        own_subfolder(folder, ".hydra")
    (folder / "plots").write_text("a file")
    with pytest.raises(UntrustedError, match="not a folder"):
        own_subfolder(folder, "plots")


def test_the_report_never_writes_its_plots_through_a_planted_link(tmp_path):
    runs = tmp_path / "runs"
    write_run(runs / "a", [ROW, {**ROW, "impl": "paged_cuda", "tokens_per_s": 20.0}])
    outside = tmp_path / "outside"
    outside.mkdir()
    (runs / "plots").symlink_to(outside)
    with pytest.raises(UntrustedError):
        build_report([runs], runs, "cmd")
    from kvbench.harness.report.__main__ import main

    assert main([str(runs)]) == 2  # the command: one line, exit 2
    assert list(outside.iterdir()) == []


def test_rows_read_through_a_link_out_of_the_run_folder_are_left_out(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    write_run(elsewhere, [{**ROW, "impl": "secret"}])
    runs = tmp_path / "runs"
    write_run(runs / "good", [ROW])
    (runs / "linked").mkdir(parents=True)
    for name in ("rows.csv", "rows.parquet"):
        (runs / "linked" / name).symlink_to(elsewhere / name)
    col = collect([runs])
    assert list(col.rows["impl"]) == ["contiguous"]
    assert any("leads outside" in p.reason for p in col.problems)


# --- nothing a folder holds blocks, or exhausts memory or time ---------------------------------------------------

def _external(root: Path, system: str = "vllm") -> Path:
    folder = root / "external" / system
    folder.mkdir(parents=True)
    return folder


def test_a_fifo_in_external_is_refused_without_blocking(tmp_path):
    write_run(tmp_path / "run", [ROW])
    os.mkfifo(_external(tmp_path) / "r.json")
    done = []
    worker = threading.Thread(target=lambda: done.append(collect([tmp_path])), daemon=True)
    worker.start()
    worker.join(30)
    assert done, "the report blocked on a FIFO"
    assert any("not a regular file" in p.reason for p in done[0].problems)


@pytest.mark.parametrize("target", ["/dev/zero", "/dev/urandom"])
def test_a_link_to_a_device_is_refused(tmp_path, target):
    write_run(tmp_path / "run", [ROW])
    (_external(tmp_path) / "r.json").symlink_to(target)
    (tmp_path / "run" / "rows.csv").unlink()
    (tmp_path / "run" / "rows.csv").symlink_to(target)
    col = collect([tmp_path])
    assert any("r.json" in str(p.path) for p in col.problems)
    assert len(col.rows) == 1  # rows.parquet still read


def test_a_link_to_a_result_outside_the_folder_is_not_followed(tmp_path):
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"backend": "vllm", "completed": 3, "duration": 1.0}))
    root = tmp_path / "report"
    write_run(root / "run", [ROW])
    (_external(root) / "r.json").symlink_to(secret)
    col = collect([root])
    assert "vllm" not in set(col.rows["impl"])
    assert any("leads outside" in p.reason for p in col.problems)


def test_reads_are_capped(tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 2048)
    with pytest.raises(UntrustedError, match="over the"):
        read_bytes(big, limit=1024)
    (tmp_path / "small.json").write_text('{"a": 1}')
    assert read_json(tmp_path / "small.json", root=tmp_path) == {"a": 1}


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path):
    start = time.perf_counter()
    with pytest.raises(UntrustedError, match="alias"):
        load_yaml(BOMB, "config.yaml")
    assert time.perf_counter() - start < 5
    assert load_yaml("a: &x [1, 2]\nb: *x\n", "ok.yaml") == {"a": [1, 2], "b": [1, 2]}  # a few aliases are fine
    with pytest.raises(UntrustedError):
        load_yaml("a: &x [*x]\n" + "b: !!python/object:os.system [id]\n", "tags.yaml")
    with pytest.raises(UntrustedError, match="cannot read"):  # more digits than Python converts: one line
        load_yaml("batch: " + "1" * 5000 + "\n", "config.yaml")


def test_replay_refuses_an_alias_bomb_config(tmp_path):
    from kvbench.harness.errors import ConfigError
    from kvbench.harness.front.replay import load_config

    (tmp_path / "config.yaml").write_text(BOMB)
    start = time.perf_counter()
    with pytest.raises(ConfigError, match="alias"):
        load_config(tmp_path)
    assert time.perf_counter() - start < 5


def test_the_report_reads_an_alias_bomb_in_overrides_as_nothing(tmp_path):
    run = tmp_path / "run"
    write_run(run, [ROW])
    (run / ".hydra").mkdir()
    (run / ".hydra" / "overrides.yaml").write_text(BOMB)
    (tmp_path / "multirun.yaml").write_text(BOMB)
    start = time.perf_counter()
    col = collect([tmp_path])
    assert time.perf_counter() - start < 20 and len(col.rows) == 1


def test_a_parquet_that_decodes_past_the_limit_is_refused(tmp_path, monkeypatch):
    import kvbench.harness.untrusted as untrusted

    write_table(pd.DataFrame({"x": ["y" * 1000] * 100}), tmp_path / "t")
    monkeypatch.setattr(untrusted, "DECODED_LIMIT", 1000)
    with pytest.raises(UntrustedError, match="decodes to"):
        read_table(tmp_path / "t.parquet")


def test_inside_and_bare_names(tmp_path):
    (tmp_path / "a").mkdir()
    assert inside(tmp_path, tmp_path / "a" / ".." / "a") == (tmp_path / "a").resolve()
    with pytest.raises(UntrustedError):
        inside(tmp_path / "a", tmp_path / "a" / ".." / "b")
    assert bare_name("points", "t") == "points"
    for bad in ("../x", "/x", "a/b", "..", ".hidden", "x" * 200):
        with pytest.raises(UntrustedError):
            bare_name(bad, "t")
    with pytest.raises(UntrustedError):
        read_yaml(tmp_path / "missing.yaml")


# --- what REPORT.md takes from a folder is escaped at the output -------------------------------------------------

HOSTILE = '<img src=x onerror=alert(1)>'


def _hostile_report(tmp_path) -> str:
    runs = tmp_path / "runs"
    run = runs / "a"
    write_run(run, [{**ROW, "device_slug": "<script>alert(1)</script>", "scenario": "decode|x"},
                    {**ROW, "impl": "paged_cuda", "status": "error", "error": "boom\n```\n" + HOSTILE + "\n| x |"}])
    (run / ".hydra").mkdir()
    (run / ".hydra" / "overrides.yaml").write_text(json.dumps(["batch=4\n```\n" + HOSTILE + "\n```",
                                                               "x=````` `y`"]))
    (_external(runs, HOSTILE) / "r.json").write_text("not json " + HOSTILE)  # a problem line names it
    (_external(runs, "=cmd|' -C calc'!A0") / "r.json").write_text(json.dumps({
        "backend": "vllm", "completed": 3, "duration": 1.5, "request_throughput": 2.0,
        "model_id": "=HYPERLINK(\"http://x\")"}))
    build_report([runs], runs, "python -m harness.report runs")
    return (runs / "REPORT.md").read_text()


def test_report_md_holds_no_raw_html_and_no_fence_a_folder_closed(tmp_path):
    text = _hostile_report(tmp_path)
    # Outside a fenced block, no tag; inside one, text is shown as it is (and must stay inside: each fence the
    # report opens closes only where the report closes it, however many backticks an override holds).
    outside, opened = [], None
    for line in text.splitlines():
        if opened is None and line.startswith("```"):
            opened = line
        elif opened is not None and line == opened:
            opened = None
        elif opened is None:
            outside.append(line)
        else:
            assert not line.startswith("## "), "a section heading inside an open fence: a fence closed early"
    assert opened is None
    # Rendered as GitHub would (CommonMark with raw HTML on, and tables): every tag the folder held is text.
    from markdown_it import MarkdownIt

    html = MarkdownIt("commonmark", {"html": True}).enable("table").render(text)
    assert "<img" not in html and "<script" not in html and "onerror=alert(1)&gt;" in html
    assert "&lt;script>alert(1)&lt;/script>" in text  # the device slug, shown as text
    assert "``````" in text  # the override with five backticks got a fence of six


def test_escaping_helpers():
    assert md_text("a|b\nc") == "a\\|b c" and "<" not in md_text("<b>") and "[" not in md_text("[x](y)").replace("\\[", "")
    assert md_code("a`b") == "``a`b``" and md_code("`x`") == "`` `x` ``" and "\n" not in md_code("a\nb")
    assert md_fence("```\nx").startswith("````\n") and md_fence("x").startswith("```\n")
    assert cell(-1.5) == "-1.5" and cell("**x**") == "\\*\\*x\\*\\*"


# --- CSV cells never run as formulas, and no cell starts a new row ------------------------------------------------

@pytest.mark.parametrize("text", ["=1+1", "+1", "-1+2", "@SUM(A1)", "\t=1", "\r=1", "'=quoted", "=a\nb,c"])
def test_csv_cells_are_neutralised_and_read_back_exactly(tmp_path, text):
    df = pd.DataFrame({"label": [text, "plain"], "value": [-1.5, 2.0], "count": [-3, 4]})
    write_table(df, tmp_path / "t")
    with open(tmp_path / "t.csv", newline="") as f:
        cells = list(csv.reader(f))
    assert len(cells) == 3  # header and two rows: a line break inside a cell starts none
    assert cells[1][0] == csv_cell(text) and cells[1][0].startswith("'")
    assert cells[1][1] == "-1.5" and cells[1][2] == "-3"  # numbers stay numbers
    back = read_table(tmp_path / "t.csv")
    assert back["label"].tolist() == [text, "plain"] and back["value"].tolist() == [-1.5, 2.0]


def test_all_runs_csv_holds_no_formula_from_a_folder(tmp_path):
    _hostile_report(tmp_path)
    with open(tmp_path / "runs" / "all_runs.csv", newline="") as f:
        cells = [c for row in csv.reader(f) for c in row]
    assert cells and not any(c.startswith(("=", "+", "@", "\t", "\r")) for c in cells)
    assert not any(c.startswith("-") and not _number(c) for c in cells)


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
