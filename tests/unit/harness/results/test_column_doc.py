"""docs/results.md's column reference is the schema's rendering, and the command that rewrites it."""

from __future__ import annotations

import pytest

from kvbench.harness.results import column_doc
from kvbench.harness.results.schema import SCHEMA, key_columns


def test_the_docs_column_reference_is_the_schemas_rendering():
    doc = column_doc.DOC.read_text()
    assert column_doc.BEGIN in doc, "docs/results.md lost its column reference's markers"
    assert column_doc.spliced(doc, column_doc.render()) == doc, ("docs/results.md's column table differs from "
                                                                 "harness/results/schema.py: run "
                                                                 "python -m harness.results.column_doc")


def test_the_rendering_lists_the_key_columns_first_then_every_column_once_more():
    text = column_doc.render()
    key_part, rest = text.split("#### Identifiers", 1)
    assert [c for c in key_columns() if f"| `{c}` |" not in key_part] == []
    assert [c.name for c in SCHEMA if f"`{c.name}`" not in rest] == []
    assert sum(line.startswith("| ") for line in rest.splitlines()) == len(SCHEMA) + 2 * len(
        {(c.kind, c.topic) for c in SCHEMA})  # a header and a rule per group


def test_a_cell_cannot_break_the_table():
    assert column_doc._cell("a | b <N> /proc/*/x") == "a \\| b &lt;N> /proc/\\*/x"


def test_check_fails_on_a_drifted_doc_and_the_command_mends_it(tmp_path, capsys):
    doc = tmp_path / "results.md"
    doc.write_text(f"# Results\n\n{column_doc.BEGIN}\n| `stale` | int | | gone |\n{column_doc.END}\n\nAfter.\n")
    assert column_doc.main(["--check", "--doc", str(doc)]) == 1
    assert "python -m harness.results.column_doc" in capsys.readouterr().err
    assert column_doc.main(["--doc", str(doc)]) == 0
    text = doc.read_text()
    assert "stale" not in text and text.startswith("# Results\n\n") and text.endswith("\n\nAfter.\n")
    assert column_doc.main(["--check", "--doc", str(doc)]) == 0


def test_a_doc_without_the_markers_is_a_clear_error():
    with pytest.raises(ValueError, match="no column reference between"):
        column_doc.spliced("# Results\n", column_doc.render())
