"""The row schema: one declaration per column, the name lists derived from it, the storage it decides."""

from __future__ import annotations

import csv
from dataclasses import replace

import pandas as pd
import pytest

from kvbench.harness import results
from kvbench.harness.results import schema
from kvbench.harness.results.schema import SCHEMA, column, extra_columns, key_columns
from tests.conftest import REPO_ROOT


def test_the_name_lists_are_the_schemas_in_the_rows_order():
    assert results.COLUMNS == results.IDENTIFIERS + results.FINGERPRINT + results.STATUS + results.METRICS
    assert results.COLUMNS == [c.name for c in SCHEMA if not c.extra]
    assert results.STATUS == ["status", "error", "notes"] and results.COLUMNS[:2] == ["run_id", "scenario"]
    assert not set(extra_columns()) & set(results.COLUMNS)
    assert set(results.TEXT_METRICS) == {c.name for c in SCHEMA if c.kind == "metric" and c.dtype == "str"}
    assert set(results.BOOLEANS) == {"git_dirty", "contended", "slo_pass", "cuda_graph", "cpu_compile"}


def test_the_new_kv_columns_sit_where_they_were_placed():
    cols = results.COLUMNS
    assert cols.index("kv_manager") == cols.index("kv_scale") + 1 and column("kv_manager").kind == "identifier"
    assert cols.index("kv_groups") == cols.index("kv_bytes_per_token") + 1 and column("kv_groups").kind == "metric"
    assert "kv_groups" in results.TEXT_METRICS  # the report must not read it as a number
    row = results.tidy([{"scenario": "decode", "status": "ok"}]).iloc[0]
    assert pd.isna(row["kv_manager"]) and pd.isna(row["kv_groups"])  # rows without them stay empty there


def test_every_column_of_every_published_row_file_is_declared():
    files = sorted((REPO_ROOT / "results").rglob("rows.csv"))
    assert files, "no published rows.csv under results/"
    undeclared = {}
    for f in files:
        with f.open(newline="") as fh:
            for name in next(csv.reader(fh)):
                if name not in schema.BY_NAME:
                    undeclared.setdefault(name, str(f.relative_to(REPO_ROOT)))
    assert not undeclared, f"columns of published rows that harness/results/schema.py does not declare: {undeclared}"


def test_a_byte_column_says_so_in_its_name_type_and_unit():
    for c in SCHEMA:
        if "bytes" in c.name.split("_"):
            assert (c.dtype, c.unit) == ("int", "bytes"), c.name
            assert results.is_count(c.name)
        assert results.is_count(c.name) == c.stored_as_integer, c.name


def test_tidy_stores_each_column_as_declared():
    sample = {"str": "x", "int": 7, "float": 0.5, "bool": True}
    df = results.tidy([{c.name: sample[c.dtype] for c in SCHEMA}])
    for c in SCHEMA:
        got = str(df[c.name].dtype)
        if c.stored_as_integer:
            assert got == "Int64", c.name
        elif c.stored_as_boolean:
            assert got == "boolean", c.name
        elif c.dtype == "float":
            assert got == "float64", c.name
        else:  # text, and the columns kept as pandas reads them
            assert got not in ("Int64", "boolean"), c.name
    assert list(df.columns) == results.COLUMNS + extra_columns()


def test_the_key_columns_are_the_few_a_reader_wants_first():
    keys = key_columns()
    assert 15 <= len(keys) <= 25 and set(keys) <= set(results.COLUMNS)
    assert {"scenario", "impl", "model", "batch", "status", "tokens_per_s", "output_tokens_per_s",
            "max_concurrency", "kv_bytes_used", "budget_kv_bytes", "weight_bytes", "ttft_ms_p50"} <= set(keys)
    assert keys == [c for c in results.COLUMNS if c in keys]  # in the rows' order
    df = results.tidy([{"scenario": "capacity", "status": "ok", "impl": "paged", "kv_bytes_used": 3}])
    assert list(df[key_columns()].columns) == keys


def test_an_undeclared_name_is_a_clear_error():
    with pytest.raises(KeyError, match="'kv_bytes_usd' is not a row column"):
        column("kv_bytes_usd")


def test_a_schema_that_repeats_a_name_or_breaks_the_kinds_order_is_refused():
    with pytest.raises(ValueError, match="'scenario' is declared twice"):
        schema._checked((*SCHEMA, column("scenario")))
    late = replace(column("run_id"), name="late_id")
    with pytest.raises(ValueError, match=r"'late_id' \(identifier\) comes after a metric column"):
        schema._checked((*SCHEMA, late))
    with pytest.raises(ValueError, match="kind 'metrics' is not one of identifier, fingerprint, status, metric"):
        schema.names("metrics")
