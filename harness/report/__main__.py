"""CLI: ``python -m harness.report [DIRS...] [--out DIR] [--max-spread F]`` (no DIRS: results/).

Exit 0 when a report was written, even if some folders could not be read (each is named in a
warning line and in REPORT.md); 1 when no run folder had rows; 2, with one line, for a bad argument
(a DIR that is not a folder, an --out that cannot be written); 141 when stdout's reader went away."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.console import USAGE_ERROR, OneLineParser, quiet_when_closed, unwritable
from harness.results import TableWriteError
from harness.untrusted import UntrustedError
from harness.report import DEFAULT_FOLDER, NoRows, build_report, regenerate_command
from harness.report.variance import DEFAULT_MAX_SPREAD, check_max_spread


def _spread(text: str) -> float:
    """``0.05`` or ``5%``."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        return check_max_spread(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--max-spread must be a fraction >= 0 or a percentage (0.05 or 5%), got {text!r}") from None


def _warn(lines: list[str]) -> None:
    for line in lines:
        print(f"kvbench report: warning: {line}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = OneLineParser(prog="python -m harness.report", description=__doc__)
    parser.add_argument("dirs", nargs="*", type=Path, help="folders searched recursively for run folders (default: results/)")
    parser.add_argument("--out", type=Path, help="where tables, plots/ and REPORT.md go (default: the first DIR)")
    parser.add_argument("--max-spread", type=_spread, default=DEFAULT_MAX_SPREAD, metavar="F",
                        help="mark a metric whose spread over a run's repeats ((max - min) / median) exceeds F, "
                             f"as a fraction or a percentage (default: {DEFAULT_MAX_SPREAD:g} = "
                             f"{100 * DEFAULT_MAX_SPREAD:g}%%)")
    parser.add_argument("--include-contended", action="store_true",
                        help="draw rows measured under CPU contention in the figures too (they stay in the tables)")
    args = parser.parse_args(argv)
    dirs = args.dirs or [Path(DEFAULT_FOLDER)]
    out = args.out or dirs[0]
    missing = [d for d in dirs if not d.is_dir()]
    if missing:
        parser.error(f"not a folder: {', '.join(map(str, missing))}")
    if (why := unwritable(out)) is not None:
        print(f"{parser.prog}: error: --out {out} cannot hold the report ({why}); choose a writable folder",
              file=sys.stderr)
        return USAGE_ERROR
    try:
        report = build_report(dirs, out, regenerate_command(argv), args.max_spread, args.include_contended)
    except NoRows as e:
        _warn(e.collection.warnings())
        print(f"kvbench report: {e}", file=sys.stderr)
        return 1
    except (UntrustedError, TableWriteError) as e:  # a planted link where the report writes, a full disk: one line
        print(f"kvbench report: {e}", file=sys.stderr)
        return USAGE_ERROR if isinstance(e, UntrustedError) else 1
    _warn(report.collection.warnings())
    rows = report.collection.rows
    print(f"{len(rows)} rows from {rows['run_dir'].nunique()} run folders; "
          f"{len(report.figures)} plots: {', '.join(report.figures) or 'none'}")
    print(f"report: {out / 'REPORT.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(quiet_when_closed(main))
