"""kvbench's commands as Unix tools: a usage error in one line, and quiet when stdout's reader has gone."""

from __future__ import annotations

import io
import os
import sys

import pytest

from kvbench.harness.console import SIGPIPE_EXIT, OneLineParser, QuietWhenClosed, quiet_when_closed, unwritable


@pytest.fixture
def closed_pipe():
    """A text stream on a pipe whose reader has already gone: every write to it fails with EPIPE."""
    read, write = os.pipe()
    os.close(read)
    stream = io.TextIOWrapper(io.BufferedWriter(io.FileIO(write, "w"), buffer_size=64))
    yield stream
    stream.close()


def test_a_stream_whose_reader_has_gone_goes_to_devnull(closed_pipe):
    with pytest.raises(BrokenPipeError):  # what Python does by itself
        closed_pipe.write("x" * 100)
        closed_pipe.flush()
    quiet = QuietWhenClosed(closed_pipe)
    quiet.write("y" * 1000)  # more than the buffer: written through, into the closed pipe
    quiet.flush()
    assert quiet.reader_gone and os.path.samestat(os.fstat(quiet.fileno()), os.stat(os.devnull))
    quiet.write("after\n")
    quiet.flush()  # /dev/null takes everything from now on


@pytest.mark.parametrize("code, expected", [(0, SIGPIPE_EXIT), (None, SIGPIPE_EXIT), (2, 2)])
def test_quiet_when_closed_exits_141_for_a_success_and_keeps_a_failure(closed_pipe, monkeypatch, code, expected):
    def command():
        print("a line nobody reads")
        sys.exit(code)

    monkeypatch.setattr(sys, "stdout", closed_pipe)
    assert quiet_when_closed(command) == expected
    assert sys.stdout is closed_pipe  # put back


def test_quiet_when_closed_leaves_a_reader_alone(capsys):
    assert quiet_when_closed(lambda: print("read") or 3) == 3
    assert capsys.readouterr().out == "read\n"


def test_a_usage_error_is_one_line_with_exit_2(capsys):
    parser = OneLineParser(prog="python -m harness.replay")
    parser.add_argument("run_dir")
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args([])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == ("python -m harness.replay: error: the following arguments are required: run_dir "
                                       "(see python -m harness.replay --help)\n")


def test_unwritable_names_a_file_in_the_path_and_creates_nothing(tmp_path):
    afile = tmp_path / "a-file"
    afile.write_text("")
    assert unwritable(afile / "x" / "y") == f"{afile} is not a folder"
    assert unwritable(tmp_path / "new" / "deeper") is None and not (tmp_path / "new").exists()
    assert unwritable(tmp_path) is None and [p.name for p in tmp_path.iterdir()] == ["a-file"]


def test_unwritable_names_a_read_only_folder(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if os.geteuid() == 0:  # root writes anyway: a folder under /proc is what root cannot write
            assert unwritable(tmp_path / "ro" / "x") is None
            assert unwritable(__import__("pathlib").Path("/proc/self/kvbench")).startswith("FileNotFoundError")
        else:
            assert unwritable(ro / "x") == "PermissionError: Permission denied"
    finally:
        ro.chmod(0o755)
