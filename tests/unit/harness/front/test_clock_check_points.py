"""The published validation set's schema: every row has a source and a configuration kvbench can price."""

import csv
import dataclasses
from pathlib import Path

import pytest

from kvbench.harness.front.clock_check_points import (COLUMNS, DEFAULT_SET, check_splits, load_points, parse_row,
                                                split_for)
from kvbench.harness.front.clock_check_price import unpriceable
from kvbench.harness.errors import ConfigError

REPO = Path(__file__).resolve().parents[4]


def _rows():
    with open(DEFAULT_SET, newline="") as f:
        return list(csv.DictReader(f))


def test_the_set_loads_with_its_sources_and_enough_points():
    points = load_points()
    assert len(points) >= 30
    assert all(p.source_url.startswith("https://") and p.engine and p.engine_version for p in points)
    assert {p.split for p in points} == {"fit", "holdout"}
    assert len({p.gpu for p in points}) >= 4


def test_every_row_names_a_gpu_conf_and_a_model_conf_or_says_it_cannot():
    """A row kvbench has no conf for is kept (its figure is published) but priced as 'not priced'."""
    points = load_points()
    priceable = [p for p in points if not unpriceable(p, REPO)]
    assert len(priceable) >= 40
    for p in points:
        assert (REPO / "conf" / "gpu" / f"{p.gpu}.yaml").is_file(), p.id
        why = unpriceable(p, REPO)
        assert why == "" or p.model in why


def test_the_split_follows_the_stated_rule_and_the_check_can_fail():
    points = load_points()
    check_splits(points)
    first = points[0]
    assert split_for(0) == "fit" and split_for(2) == "holdout" and split_for(5) == "holdout"
    flipped = [dataclasses.replace(first, split="holdout")] + points[1:]
    with pytest.raises(ConfigError, match="split='holdout'"):
        check_splits(flipped)


@pytest.mark.parametrize("key,value,allowed", [("metric", "ttft_s", "ttft_ms_mean"), ("workload", "chat", "fixed"),
                                               ("weight_dtype", "int4", "fp8"), ("gpu_count", "0", "integer >= 1"),
                                               ("source_url", "http://x", "https://"), ("value", "-1", "> 0"),
                                               ("request_rate", "0", "'inf'")])
def test_a_bad_row_names_its_key_value_and_what_is_allowed(key, value, allowed):
    row = dict(_rows()[0], **{key: value})
    with pytest.raises(ConfigError) as e:
        parse_row(row)
    assert key in str(e.value) and repr(value) in str(e.value) and allowed in str(e.value)
    assert row["id"] in str(e.value)


def test_a_repeated_id_is_refused(tmp_path):
    rows = _rows()
    path = tmp_path / "set.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows([rows[0], dict(rows[1], id=rows[0]["id"])])
    with pytest.raises(ConfigError, match="unique"):
        load_points(path)


@pytest.mark.parametrize("mean", ["64", "129", "x"])
def test_an_output_mean_outside_what_uniform_lengths_up_to_max_tokens_can_give_is_refused(mean):
    row = dict(_rows()[0], output_len="128", output_len_mean=mean)
    with pytest.raises(ConfigError, match="output_len_mean"):
        parse_row(row)


def test_the_rtx4090_rows_carry_the_sources_own_mean_output():
    # The source's table: output tok/s over req/s is 100.0-100.5 tokens at every concurrency (no --ignore-eos)
    rows = {p.id: p for p in load_points()}
    assert rows["r4090-c4-tput"].output_len_mean == 100 and rows["r4090-c4-tput"].output_len == 128
    assert rows["l4-c8-ttft"].output_len_mean is None  # --ignore-eos: every output whole


@pytest.mark.parametrize("text", ["moe_gemm_half_n=1400", "engine.name=x", "engine.moe_gemm_half_n=abc",
                                  "engine.moe_gemm_half_n=inf", "engine.frontend_ms=-1",
                                  "engine.frontend_ms=5 engine.frontend_ms=6", "engine.moe_gemm_half_n=1;rm"])
def test_engine_overrides_are_engine_numbers_only_each_once(text):
    """The set is data: what it passes to a command line is a known engine key and a plain number."""
    with pytest.raises(ConfigError) as e:
        parse_row(dict(_rows()[0], engine_overrides=text))
    assert "engine_overrides" in str(e.value) and "moe_gemm_half_n" in str(e.value)


def test_engine_overrides_parse_to_canonical_command_line_items():
    row = dict(_rows()[0], engine_overrides=" engine.moe_gemm_half_n=1400.0  engine.frontend_ms=8 ")
    assert parse_row(row).engine_overrides == ("engine.moe_gemm_half_n=1400", "engine.frontend_ms=8")
    assert parse_row(dict(_rows()[0], engine_overrides="")).engine_overrides == ()


def test_every_engine_override_in_the_set_is_explained_in_its_sources_notes():
    """An override changes what a figure is priced with: the source's rows must say which and why (a row's note, or
    its source's first row's), so that nobody reads a tuned figure as a plain one."""
    points = load_points()
    notes: dict[str, str] = {}
    for p in points:
        notes[p.source_url] = notes.get(p.source_url, "") + " " + p.note
    overridden = [p for p in points if p.engine_overrides]
    assert overridden, "the set has an overridden row (Qwen3-30B-A3B's August 2025 fused_moe configs)"
    for p in overridden:
        for item in p.engine_overrides:
            assert item in notes[p.source_url], (p.id, item)
