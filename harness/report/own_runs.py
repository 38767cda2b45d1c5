"""What ``python -m harness.report`` says when given no folder: it reads the user's own runs (runs/, where
every run and sweep of theirs lands: conf/config.yaml), so it names the published report beside them,
and with no runs yet it says so in one line, pointing to the quick start, instead of an empty report.
"""

from __future__ import annotations

from kvbench.harness.report import DEFAULT_FOLDER, PUBLISHED_FOLDER

FIRST_RUN = "python -m harness +impl=paged batch=100"  # README.md's quick start: a real decode run (seconds)
REGENERATE_PUBLISHED = f"python -m harness.report {PUBLISHED_FOLDER}/"


def published_line() -> str:
    """Where the published report is, and the command that makes it again from make sweep's sets."""
    return f"published report: {PUBLISHED_FOLDER}/REPORT.md (regenerate: {REGENERATE_PUBLISHED})"


def no_runs_line() -> str:
    """One line for a report asked of the user's runs before there are any."""
    return (f"kvbench report: no runs yet under {DEFAULT_FOLDER}/: make one first (README.md, Quick start: "
            f"{FIRST_RUN}); {published_line()}")
