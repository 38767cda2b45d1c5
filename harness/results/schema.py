"""The row schema: every column a row may carry, declared once (name, kind, type, unit, meaning, key).

The name lists harness/results exports (IDENTIFIERS, FINGERPRINT, STATUS, METRICS, COLUMNS, TEXT_METRICS,
BOOLEANS, COUNTS) are derived from it here, in the declarations' order, which is the rows' files' order;
docs/results.md's column reference is rendered from it (harness/results/column_doc.py).
"""

from __future__ import annotations

from kvbench.harness.results.column import KINDS, Column
from kvbench.harness.results.columns_ids import FINGERPRINT_COLUMNS, IDENTIFIER_COLUMNS, STATUS_COLUMNS
from kvbench.harness.results.columns_run import RUN_COLUMNS
from kvbench.harness.results.columns_service import SERVICE_COLUMNS

SCHEMA: tuple[Column, ...] = (*IDENTIFIER_COLUMNS, *FINGERPRINT_COLUMNS, *STATUS_COLUMNS, *RUN_COLUMNS,
                              *SERVICE_COLUMNS)

# Whole-number columns of the side tables (capacity's points, the steps table), which ``tidy`` stores as
# integers like a row's counts.
SIDE_TABLE_COUNTS = ("concurrency", "running", "waiting", "tokens", "prefix_hit_tokens", "admitted_prompt_tokens")


def _checked(schema: tuple[Column, ...]) -> dict[str, Column]:
    """The schema by name; a name declared twice, or a kind out of the rows' order, is an error here."""
    by_name: dict[str, Column] = {}
    last = 0
    for c in schema:
        if c.name in by_name:
            raise ValueError(f"column {c.name!r} is declared twice in the row schema")
        at = KINDS.index(c.kind)
        if at < last:
            raise ValueError(f"column {c.name!r} ({c.kind}) comes after a {KINDS[last]} column: a row's kinds run "
                             f"in the order {', '.join(KINDS)}")
        last = at
        by_name[c.name] = c
    return by_name


BY_NAME = _checked(SCHEMA)


def column(name: str) -> Column:
    """The declaration of ``name``; an undeclared name is a KeyError saying so."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name!r} is not a row column (harness/results/schema.py declares them)") from None


def names(kind: str, extras: bool = False) -> list[str]:
    """The names of ``kind``'s columns in the rows' order; ``extras``: with those carried after COLUMNS."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is not one of {', '.join(KINDS)}")
    return [c.name for c in SCHEMA if c.kind == kind and (extras or not c.extra)]


def key_columns() -> list[str]:
    """The ~20 columns a reader wants first, in the rows' order: ``df[key_columns()]`` (or with
    ``[c for c in key_columns() if c in df]`` for a frame that lacks some)."""
    return [c.name for c in SCHEMA if c.key]


def extra_columns() -> list[str]:
    """Declared columns outside COLUMNS: a row that has one carries it after them."""
    return [c.name for c in SCHEMA if c.extra]


IDENTIFIERS = names("identifier")
FINGERPRINT = names("fingerprint")
STATUS = names("status")
METRICS = names("metric")
COLUMNS = IDENTIFIERS + FINGERPRINT + STATUS + METRICS
# The metric columns that are not numbers (the report reads every other metric as one).
TEXT_METRICS = tuple(c.name for c in SCHEMA if c.kind == "metric" and c.dtype == "str" and not c.extra)
# Columns of text, identifiers and fingerprint included: a CSV gives back ``13.0`` (cuda_version) or a hex digest of
# digits as a number unless it is read as text (harness/untrusted read_table), so a published CSV reads as its Parquet.
TEXT_COLUMNS = tuple(c.name for c in SCHEMA if c.dtype == "str" and c.typed)
# Columns of true/false (a CSV gives them back as the text "True"/"False").
BOOLEANS = tuple(c.name for c in SCHEMA if c.stored_as_boolean)
# Counts (tokens, steps, requests, heads, ...) are whole numbers; with every byte column (harness/results
# is_count: a word ``bytes`` in the name) they are stored as nullable integers, so an empty cell stays empty
# instead of turning the column into floats.
COUNTS = tuple(c.name for c in SCHEMA if c.stored_as_integer and "bytes" not in c.name.split("_")) \
    + SIDE_TABLE_COUNTS
