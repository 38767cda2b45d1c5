"""REPORT.md's first screen: per cache, memory on the paper's workload, max concurrency where the budget binds,
throughput there, and the machine; plain words where a figure is missing or ``batch`` bound the count."""

from __future__ import annotations

import re

import pandas as pd

from kvbench.harness.report.collect import Collection
from kvbench.harness.report.markdown import SECTIONS, render
from kvbench.harness.report.page_one import FLAG, PLOT_SENTENCES, summary_table

ENV = {"device_slug": "cpu-a", "device": "cpu", "status": "ok"}


def paper_points(at: int = 100) -> pd.DataFrame:
    return pd.DataFrame([
        {"run_dir": "r/capacity/0", "model": "llama-2-7b", "workload": "seeds", "max_seq_len": 2048, "block_size": 16,
         "budget_kv_bytes": 111.7e9, "concurrency": c, "variant": v, "kv_bytes_reserved": b * c / 100,
         "kv_bytes_used": 1.0}
        for c in (50, at) for v, b in (("contiguous", 107.4e9), ("paged", 26.8e9), ("paged_shared", 20.0e9))])


def search(impl: str, n: int, batch: int = 8) -> dict:
    return {**ENV, "run_dir": f"r/max_concurrency/{impl}", "scenario": "max_concurrency", "model": "tiny-llama",
            "workload": "fixed", "max_seq_len": 64, "budget_kv_bytes": 2.5e6, "impl": impl, "batch": batch,
            "max_concurrency": n, "max_concurrency_analytic": n}


def capacity(impl: str, n: int, predicted: int) -> dict:
    return {**ENV, "run_dir": f"r/capacity/{impl}", "scenario": "capacity", "model": "llama-2-7b",
            "workload": "seeds", "max_seq_len": 2048, "budget_kv_bytes": 111.7e9, "impl": impl, "batch": 100,
            "max_concurrency": n, "max_concurrency_analytic": predicted}


def decode(impl: str, batch: int, tps: float, contended: bool = False) -> dict:
    return {**ENV, "run_dir": f"r/decode/{impl}{batch}", "scenario": "decode", "model": "tiny-llama",
            "workload": "fixed", "impl": impl, "batch": batch, "output_tokens_per_s": tps, "contended": contended}


def test_each_cache_gets_its_memory_concurrency_throughput_and_machine_from_the_rows():
    rows = pd.DataFrame([search("contiguous", 9), search("paged_torch", 12), decode("contiguous", 9, 300.0),
                         decode("paged_torch", 12, 410.0, contended=True), decode("paged_torch", 1, 50.0)])
    table, words = summary_table(Collection(rows, paper_points()))
    got = table.set_index("cache")
    assert list(got["machine"]) == ["cpu-a", "cpu-a"]
    assert got.loc["contiguous", "memory"] == "107 GB" and got.loc["paged_torch", "memory"] == "26.8 GB"
    assert got.loc["contiguous", "max concurrency"].startswith("9 (tiny-llama, fixed workload, KV budget 2.5 MB")
    assert got.loc["paged_torch", "max concurrency"].startswith("12 ")
    assert got.loc["contiguous", "throughput"] == "300 output tok/s"
    assert got.loc["paged_torch", "throughput"] == f"410 output tok/s{FLAG}"  # measured while busy: marked
    assert words == []


def test_where_batch_bound_both_caches_no_ratio_is_claimed_and_the_sentence_says_so():
    rows = pd.DataFrame([capacity("contiguous", 100, 103), capacity("paged_torch", 100, 415)])
    table, words = summary_table(Collection(rows, paper_points()))
    assert all("batch bound, not the budget" in c for c in table["max concurrency"])
    assert all(c.startswith("≥ 100") for c in table["max concurrency"])
    (said,) = words
    assert "`batch=100` stopped contiguous, paged_torch before the budget did" in said
    assert "contiguous 103; paged_torch 415" in said and "1.00" not in said


def test_a_budget_bound_setting_is_chosen_over_a_batch_bound_one():
    rows = pd.DataFrame([capacity("contiguous", 100, 103), capacity("paged_torch", 100, 415),
                         search("contiguous", 9), search("paged_torch", 12)])
    table, words = summary_table(Collection(rows, paper_points()))
    assert [c.split(" ")[0] for c in table["max concurrency"]] == ["9", "12"]
    assert any("stopped contiguous, paged_torch" in w for w in words)  # the paper's workload still explained


def test_missing_figures_are_said_in_words():
    rows = pd.DataFrame([search("contiguous", 9), search("paged_torch", 12)])
    table, words = summary_table(Collection(rows, pd.DataFrame()))
    assert any("No capacity run of the paper's workload" in w for w in words)
    assert set(table["memory"]) == {"–"}
    assert set(table["throughput"]) == {"not measured (no decode run)"}
    rows = pd.DataFrame([search("contiguous", 9), search("paged_torch", 12), decode("contiguous", 8, 1.0)])
    table, _ = summary_table(Collection(rows, paper_points(at=64)))
    assert table.set_index("cache").loc["contiguous", "throughput"] == "not measured at batch 9 (decode ran at batch 8)"


def test_without_any_concurrency_run_the_table_still_gives_the_memory():
    decode_only = pd.DataFrame([decode("contiguous", 8, 1.0)])
    table, words = summary_table(Collection(decode_only, paper_points()))
    assert dict(zip(table["cache"], table["memory"])) == {"contiguous": "107 GB", "paged": "26.8 GB",
                                                          "paged_shared": "20 GB"}
    assert any("No run measured a max concurrency" in w for w in words)


def test_every_plot_has_one_sentence():
    assert set(PLOT_SENTENCES) == {name for name, _ in SECTIONS}
    # one sentence: ends with a full stop, and none inside (an abbreviation such as "Fig. 12" aside)
    assert all(s.endswith(".") and not re.search(r"(?<!Fig)\. ", s) for s in PLOT_SENTENCES.values())


def test_page_one_comes_first_and_links_each_plot_with_its_sentence():
    rows = pd.DataFrame([search("contiguous", 9), search("paged_torch", 12)])
    text = render(Collection(rows, paper_points()), ["max_concurrency"], "python -m harness.report", {})
    first = text.split("## What paging buys")[0]
    assert "## Summary" in first and "| cpu-a | contiguous | 107 GB | 9 (" in first
    assert f"[1. Max concurrency: measured vs predicted](#1-max-concurrency-measured-vs-predicted): " \
           f"{PLOT_SENTENCES['max_concurrency']}" in first
    section = text.split("## 1. Max concurrency: measured vs predicted")[1]
    assert section.lstrip().startswith(PLOT_SENTENCES["max_concurrency"])  # the sentence above the plot too
    assert text.index("## Summary") < text.index("## 1. Max concurrency") < text.index("## Environment")


def test_text_from_a_folder_is_escaped_in_the_sentences():
    rows = pd.DataFrame([{**capacity(impl, 100, 103), "model": "llama-2-7b"} for impl in ("contiguous", "paged_*x*")])
    _, words = summary_table(Collection(rows, paper_points()))
    assert "paged\\_\\*x\\*" in words[0] or "paged_\\*x\\*" in words[0]
    assert "`batch=100`" in words[0]  # kvbench's own markup kept
