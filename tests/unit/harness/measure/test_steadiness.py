"""The machine-steadiness probe: windows of the fixed unit's time over its median, and one-line bad arguments."""

from __future__ import annotations

import pytest

from kvbench.harness.measure.steadiness import main, windows


def test_windows_cover_the_run_and_centre_on_one():
    base, spread = windows(0.6, 0.2)
    assert base > 0 and 3 <= len(spread) <= 4  # a last unit may start just before the end
    assert all(v > 0 for v in spread)
    assert min(spread) <= 1.0 <= max(spread) or len(set(spread)) == 1  # the median unit lies in some window


def test_the_command_prints_the_windows(capsys):
    assert main(["0.4", "0.2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("unit ") and "window's median unit over it" in out[0]
    assert len(out[1].split()) >= 2 and out[2].startswith("slowest window ")


@pytest.mark.parametrize("argv", [["0"], ["1", "2"], ["x"], ["1", "0.5", "3"]])
def test_bad_arguments_are_one_line(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("steadiness: ") and "usage: python -m harness.measure.steadiness" in err[0]
