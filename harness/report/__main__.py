"""CLI: ``python -m harness.report [DIRS...] [--out DIR] [--max-spread F]`` (no DIRS: runs/, your own runs).

With no DIRS it reads runs/ (every run and sweep of yours) and writes runs/REPORT.md, and names the
published report (results/REPORT.md; ``python -m harness.report results/`` regenerates it).
Exit 0 when a report was written, even if some folders could not be read (each is named in a
warning line and in REPORT.md); 1 when no run folder had rows (no runs yet: one line); 2, with one line,
for a bad argument (a DIR that is not a folder, an --out that cannot be written); 141 when stdout's
reader went away."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvbench.harness.console import USAGE_ERROR, OneLineParser, quiet_when_closed, unwritable
from kvbench.harness.results import TableWriteError
from kvbench.harness.untrusted import UntrustedError
from kvbench.harness.report import DEFAULT_FOLDER, NoRows, build_report, regenerate_command
from kvbench.harness.report.external import ExternalDefaults
from kvbench.harness.report.own_runs import no_runs_line, published_line
from kvbench.harness.report.variance import DEFAULT_MAX_SPREAD, check_max_spread, parse_fraction


def _spread(text: str) -> float:
    """``0.05`` or ``5%``."""
    try:
        return check_max_spread(parse_fraction(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--max-spread must be a fraction >= 0 or a percentage (0.05 or 5%), got {text!r}") from None


def _batch(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--external-batch must be a whole number of requests >= 1, got {text!r}")
    return int(text)


def _device(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("--external-device must name a machine (a device slug such as nvidia-h100)")
    return text.strip()


def _warn(lines: list[str]) -> None:
    for line in lines:
        print(f"kvbench report: warning: {line}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = OneLineParser(prog="python -m harness.report", description=__doc__)
    parser.add_argument("dirs", nargs="*", type=Path, help="folders searched recursively for run folders (default: runs/, your own runs)")
    parser.add_argument("--out", type=Path, help="where tables, plots/ and REPORT.md go (default: the first DIR)")
    parser.add_argument("--max-spread", type=_spread, default=DEFAULT_MAX_SPREAD, metavar="F",
                        help="mark a metric whose spread over a run's repeats ((max - min) / median) exceeds F, "
                             f"as a fraction or a percentage (default: {DEFAULT_MAX_SPREAD:g} = "
                             f"{100 * DEFAULT_MAX_SPREAD:g}%%)")
    # Flagged rows are always drawn now (ringed, "flagged (machine busy)"); the switch stays so old commands run.
    parser.add_argument("--include-contended", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--external-device", type=_device, metavar="SLUG",
                        help="the machine of imported vLLM results that record no device (external/<system>/*.json)")
    parser.add_argument("--external-batch", type=_batch, metavar="N",
                        help="the batch (requests at once) of imported vLLM results that record none")
    args = parser.parse_args(argv)
    dirs = args.dirs or [Path(DEFAULT_FOLDER)]
    own = not args.dirs  # the user's own runs (harness/report/own_runs.py): the published report is named too
    if own and not dirs[0].is_dir():
        print(no_runs_line(), file=sys.stderr)
        return 1
    out = args.out or dirs[0]
    missing = [d for d in dirs if not d.is_dir()]
    if missing:
        parser.error(f"not a folder: {', '.join(map(str, missing))}")
    if (why := unwritable(out)) is not None:
        print(f"{parser.prog}: error: --out {out} cannot hold the report ({why}); choose a writable folder",
              file=sys.stderr)
        return USAGE_ERROR
    try:
        external = ExternalDefaults(args.external_device, args.external_batch)
        report = build_report(dirs, out, regenerate_command(argv), args.max_spread, external)
    except NoRows as e:
        _warn(e.collection.warnings())
        print(no_runs_line() if own else f"kvbench report: {e}", file=sys.stderr)
        return 1
    except (UntrustedError, TableWriteError) as e:  # a planted link where the report writes, a full disk: one line
        print(f"kvbench report: {e}", file=sys.stderr)
        return USAGE_ERROR if isinstance(e, UntrustedError) else 1
    _warn(report.collection.warnings())
    rows = report.collection.rows
    print(f"{len(rows)} rows from {rows['run_dir'].nunique()} run folders; "
          f"{len(report.figures)} plots: {', '.join(report.figures) or 'none'}")
    print(f"report: {out / 'REPORT.md'}")
    if own:
        print(published_line())
    return 0


if __name__ == "__main__":
    sys.exit(quiet_when_closed(main))
