"""One row column's declaration: its name, kind, type, unit and meaning (harness/results/schema.py holds them all).

A declaration is data the tables, the report and docs/results.md read: ``kind`` places the column in a row
(identifiers first, then the fingerprint, the status, the metrics), ``topic`` groups it for a reader, and
``key`` marks the few columns a reader wants first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from numbers import Integral, Real

import numpy as np

# Where a column sits in a row, in this order (a row's files keep it).
KINDS = ("identifier", "fingerprint", "status", "metric")
# The type of a column's values: text, whole numbers, real numbers, true/false.
DTYPES = ("str", "int", "float", "bool")


@dataclass(frozen=True)
class Column:
    name: str
    dtype: str  # one of DTYPES
    unit: str | None  # tokens, bytes, s, ms, ...; None for text, flags and plain counts of things
    meaning: str  # one line: what the value is, where it applies (empty elsewhere, never invented)
    key: bool = False  # among the ~20 a reader wants first (schema.key_columns())
    # Not in ``COLUMNS``: a row that has it carries it after them (it came after the published files'
    # column order was fixed; putting it among them would add an empty column to every row).
    extra: bool = False
    # int and bool: ``tidy`` stores the column as a nullable Int64 / boolean. False: kept as pandas reads it,
    # as the published files have always held it (changing that would change their column types).
    typed: bool = True
    kind: str = ""  # one of KINDS: set by ``group``
    topic: str = ""  # the heading docs/results.md lists it under: set by ``group``

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"column {self.name!r}: dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if self.kind and self.kind not in KINDS:
            raise ValueError(f"column {self.name!r}: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if not self.meaning.strip() or "\n" in self.meaning:
            raise ValueError(f"column {self.name!r}: its meaning must be one non-empty line")
        if self.key and self.extra:
            raise ValueError(f"column {self.name!r}: a key column must be in COLUMNS, not an extra")

    @property
    def stored_as_integer(self) -> bool:
        """Whether ``tidy`` stores it as a nullable integer (a count, or a byte column)."""
        return self.dtype == "int" and self.typed

    @property
    def stored_as_boolean(self) -> bool:
        return self.dtype == "bool" and self.typed


def group(kind: str, topic: str, *columns: Column) -> list[Column]:
    """``columns`` with their kind and topic set (declarations are written a topic at a time)."""
    return [replace(c, kind=kind, topic=topic) for c in columns]


def missing(value) -> bool:
    """An empty cell: None, pandas' NA, or NaN."""
    if value is None:
        return True
    try:
        return bool(value != value)  # NaN and pandas' NA (whose comparison is NA, falsy through bool: caught)
    except TypeError:
        return True


def fits(column: Column, value) -> bool:
    """Whether ``value`` is of ``column``'s type; an empty cell fits every column.

    An int column takes a whole float too (a workload's mean length is one: the table stores it as an
    integer, as ``tidy`` does); a float column takes an integer (a rate of 2 requests per second)."""
    if missing(value):
        return True
    if column.dtype == "str":
        return isinstance(value, str)
    if column.dtype == "bool":
        return isinstance(value, (bool, np.bool_))
    if isinstance(value, (bool, np.bool_)):
        return False  # True is an int to Python, never a count to a reader
    if column.dtype == "int":
        return isinstance(value, Integral) or (isinstance(value, Real) and math.isfinite(value)
                                               and float(value).is_integer())
    return isinstance(value, Real)
