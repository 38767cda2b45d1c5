"""A column declaration: what its type admits, and declarations that cannot stand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from kvbench.harness.results.column import Column, fits, group, missing


def col(dtype: str, **kw) -> Column:
    return Column("x", dtype, None, "a column", **kw)


@pytest.mark.parametrize("dtype, good, bad", [
    ("str", ["paged", ""], [1, 1.5, True]),
    ("int", [3, np.int64(3), 96.0, 2**70], [1.5, True, np.bool_(False), "3", math.inf]),
    ("float", [1.5, 2, np.float32(0.25), math.inf], [True, "1.5"]),
    ("bool", [True, False, np.bool_(True)], [1, 0, "True", 1.0]),
])
def test_a_value_fits_its_columns_type_and_nothing_else(dtype, good, bad):
    c = col(dtype)
    assert all(fits(c, v) for v in good), [v for v in good if not fits(c, v)]
    assert not any(fits(c, v) for v in bad), [v for v in bad if fits(c, v)]


@pytest.mark.parametrize("value", [None, math.nan, pd.NA, np.nan])
def test_an_empty_cell_fits_every_column(value):
    assert missing(value)
    assert all(fits(col(d), value) for d in ("str", "int", "float", "bool"))


def test_a_value_is_not_missing():
    assert not any(missing(v) for v in (0, 0.0, "", False, "nan"))


@pytest.mark.parametrize("kw, says", [
    ({"dtype": "double"}, "str, int, float, bool"),
    ({"kind": "measure"}, "identifier, fingerprint, status, metric"),
    ({"meaning": " "}, "one non-empty line"),
    ({"meaning": "two\nlines"}, "one non-empty line"),
    ({"key": True, "extra": True}, "key column must be in COLUMNS"),
])
def test_a_declaration_that_cannot_stand_says_why(kw, says):
    args = {"name": "x", "dtype": "int", "unit": None, "meaning": "a column", **kw}
    with pytest.raises(ValueError, match="column 'x'") as err:
        Column(**args)
    assert says in str(err.value)


def test_group_sets_kind_and_topic_and_keeps_the_order():
    a, b = group("metric", "KV accounting", Column("a", "int", "bytes", "m"), Column("b", "float", None, "m"))
    assert (a.name, b.name) == ("a", "b") and {a.kind, b.kind} == {"metric"} and a.topic == "KV accounting"
    assert a.stored_as_integer and not b.stored_as_integer
    assert not col("int", typed=False).stored_as_integer and col("bool").stored_as_boolean
