"""docs/results.md's column reference, rendered from the row schema (harness/results/schema.py).

The doc holds the rendering between two marker lines; tests/unit/harness/results/test_column_doc.py checks
it equals ``render()``, so the doc cannot drift from the schema. After changing a declaration:

    python -m harness.results.column_doc            # rewrites the table in docs/results.md
    python -m harness.results.column_doc --check    # exit 1 if the doc differs (what the test checks)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvbench.harness.results.column import Column
from kvbench.harness.results.schema import SCHEMA

BEGIN = ("<!-- row-columns: rendered from harness/results/schema.py by `python -m harness.results.column_doc`; "
         "edit the schema, not this table -->")
END = "<!-- /row-columns -->"
# The checkout's docs/results.md (harness/results/ is two folders below the checkout's root).
DOC = Path(__file__).resolve().parents[2] / "docs" / "results.md"
KIND_TITLES = {"identifier": "Identifiers", "fingerprint": "Fingerprint", "status": "Status", "metric": "Metrics"}


def _cell(text: str) -> str:
    """``text`` as a Markdown table cell: a ``|`` would end the cell, ``<x>`` reads as HTML, ``*`` as emphasis."""
    return text.replace("|", "\\|").replace("<", "&lt;").replace("*", "\\*")


def _line(c: Column, bold_key: bool) -> str:
    name = f"**`{c.name}`**" if bold_key and c.key else f"`{c.name}`"
    dtype = c.dtype + ("" if c.typed or c.dtype not in ("int", "bool") else " (stored untyped)")
    meaning = c.meaning + (" (carried after the other columns)" if c.extra else "")
    return f"| {name} | {dtype} | {c.unit or ''} | {_cell(meaning)} |"


def _table(columns: list[Column], bold_key: bool) -> list[str]:
    return ["| column | type | unit | meaning |", "| --- | --- | --- | --- |",
            *(_line(c, bold_key) for c in columns)]


def render() -> str:
    """The column reference: the key columns first, then every column grouped by kind and topic, in the rows'
    order (key columns in bold there too)."""
    out = [BEGIN, "", "#### Key columns", "",
           "What a reader wants first (`harness.results.key_columns()` selects them from a frame):", "",
           *_table([c for c in SCHEMA if c.key], bold_key=False)]
    groups: dict[tuple[str, str], list[Column]] = {}
    for c in SCHEMA:
        groups.setdefault((c.kind, c.topic), []).append(c)
    for (kind, topic), columns in groups.items():
        out += ["", f"#### {KIND_TITLES[kind]}: {topic}", "", *_table(columns, bold_key=True)]
    return "\n".join([*out, "", END])


def spliced(doc: str, table: str) -> str:
    """``doc`` with the text between its marker lines (the markers included) replaced by ``table``."""
    start, end = doc.find(BEGIN), doc.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the doc has no column reference between {BEGIN!r} and {END!r}")
    return doc[:start] + table + doc[end + len(END):]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.results.column_doc", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the doc's table differs; write nothing")
    parser.add_argument("--doc", type=Path, default=DOC, help=f"the doc to rewrite (default: {DOC})")
    args = parser.parse_args(argv)
    text = args.doc.read_text()
    new = spliced(text, render())
    if args.check:
        if new != text:
            print(f"{args.doc}: the column reference differs from harness/results/schema.py; run "
                  "python -m harness.results.column_doc", file=sys.stderr)
            return 1
        return 0
    if new != text:
        args.doc.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
