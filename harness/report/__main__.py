"""CLI: ``python -m harness.report [DIRS...] [--out DIR]`` (no DIRS: results/)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.report import build_report, regenerate_command


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m harness.report", description=__doc__)
    parser.add_argument("dirs", nargs="*", type=Path, help="folders searched recursively for run folders (default: results/)")
    parser.add_argument("--out", type=Path, help="where tables, plots/ and REPORT.md go (default: the first DIR)")
    args = parser.parse_args(argv)
    dirs = args.dirs or [Path("results")]
    out = args.out or dirs[0]
    missing = [d for d in dirs if not d.is_dir()]
    if missing:
        parser.error(f"not a folder: {', '.join(map(str, missing))}")
    try:
        report = build_report(dirs, out, regenerate_command(argv))
    except FileNotFoundError as e:
        print(f"kvbench report: {e}", file=sys.stderr)
        return 1
    rows = report.collection.rows
    print(f"{len(rows)} rows from {rows['run_dir'].nunique()} run folders; "
          f"{len(report.figures)} plots: {', '.join(report.figures) or 'none'}")
    print(f"report: {out / 'REPORT.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
