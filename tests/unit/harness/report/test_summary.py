"""REPORT.md opens with the answer: what paging buys, per device and model, linked to its evidence."""

from pathlib import Path

import pandas as pd

from kvbench.harness.report.collect import Collection
from kvbench.harness.report.markdown import anchor, answer_section, render

ENV = {"device_slug": "cpu-intel-xeon-2core", "device": "cpu", "cpu_name": "Intel(R) Xeon(R) Processor",
       "status": "ok"}


def _collection() -> Collection:
    points = pd.DataFrame([
        {"run_dir": "results/x/capacity/0", "model": "llama-2-7b", "workload": "seeds", "max_seq_len": 2048,
         "block_size": 16, "budget_kv_bytes": 111.7e9, "concurrency": c, "variant": v, "kv_bytes_reserved": b}
        for c, v, b in ((100, "contiguous", 107.4e9), (100, "paged", 26.8e9), (50, "contiguous", 53.7e9),
                        (50, "paged", 13.4e9))])
    rows = pd.DataFrame([
        {**ENV, "run_dir": "results/x/max_concurrency/0", "scenario": "max_concurrency", "model": "tiny-llama",
         "workload": "fixed", "max_seq_len": 64, "budget_kv_bytes": 2.5e6, "impl": impl, "batch": 8,
         "max_concurrency": n, "max_concurrency_analytic": n}
        for impl, n in (("contiguous", 9), ("paged_torch", 12), ("orca_max", 30))] + [
        {**ENV, "run_dir": "results/x/max_rate/0", "scenario": "max_rate", "model": "tiny-llama", "workload": "chat",
         "dtype": "float32", "batch": 32, "max_seq_len": 512, "arrival": "poisson", "slo": "interactive",
         "clock": "wall", "impl": impl, "max_rate_rps": r, "probes": 6}
        for impl, r in (("contiguous", 20.0), ("paged_cuda", 35.0), ("paged_torch", 20.0))])
    return Collection(rows, points)


def test_the_answer_names_each_fact_with_its_figure_section_and_command():
    col = _collection()
    text = "\n".join(answer_section(col, ["memory_vs_concurrency", "max_concurrency"], has_max_rate=True))
    assert "**80.6 GB** KV memory saved" in text and "at 100 concurrent requests (seeds workload" in text
    assert "**1.33×** max concurrency" in text and "2.5 MB KV budget" in text  # paged_torch 12 / contiguous 9
    assert "orca_max" not in text  # a reservation baseline, not paging
    assert "**1.75×** max rate within the SLO" in text and "paged_cuda 35 vs contiguous 20 req/s" in text
    assert "(#2-max-concurrency-measured-vs-predicted)" in text and "(#max-request-rate-under-the-slo)" in text
    assert "(#cmd-results-x-max-rate-0)" in text


def test_report_opens_with_the_answer_and_every_link_has_a_target():
    col = _collection()
    col.commands = []
    text = render(col, ["memory_vs_concurrency", "max_concurrency"], "python -m harness.report", {})
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    # page one: the summary, then what paging buys, then the plots; the environment after the evidence
    assert headings[:4] == ["## Summary", "## What paging buys", "## 1. KV memory needed vs concurrent requests",
                            "## 2. Max concurrency: measured vs predicted"]
    assert headings.index("## Environment") > 3
    targets = {anchor(h[3:]) for h in headings}
    import re

    for link in re.findall(r"\]\(#([^)]+)\)", text):
        if not link.startswith("cmd-"):  # commands are anchored in their own section (none recorded here)
            assert link in targets, link


def test_anchor_is_githubs():
    assert anchor("1. KV memory needed vs concurrent requests") == "1-kv-memory-needed-vs-concurrent-requests"
    assert anchor("3. Max concurrency: measured vs predicted") == "3-max-concurrency-measured-vs-predicted"


def test_a_simulated_gpus_figure_from_two_machines_folders_is_said_once_each_machines_own_twice():
    from kvbench.harness.report.service_plots import max_rate_table
    from kvbench.harness.report.summary import rate_headlines

    def rows(slug: str, clock: str, gpu, scale: float) -> list[dict]:
        return [{**ENV, "device_slug": slug, "run_dir": f"results/{slug}/m/0", "scenario": "max_rate",
                 "model": "m", "workload": "chat", "dtype": "float32", "batch": 32, "max_seq_len": 512,
                 "arrival": "poisson", "slo": "s", "clock": clock, "gpu": gpu, "impl": impl, "max_rate_rps": r * scale,
                 "probes": 3} for impl, r in (("contiguous", 2.0), ("paged_torch", 6.0))]

    table = pd.DataFrame(rows("cpu-a", "simulated", "1x a100-40gb", 1) + rows("cpu-b", "simulated", "1x a100-40gb", 1)
                         + rows("cpu-a", "wall", None, 1) + rows("cpu-b", "wall", None, 2))
    said = rate_headlines(Collection(table, pd.DataFrame()), max_rate_table(table))
    assert [h.device for h in said] == ["cpu-a", "cpu-b", "simulated 1x a100-40gb"]
    assert [h.run_dir for h in said] == ["results/cpu-a/m/0", "results/cpu-b/m/0", "results/cpu-a/m/0"]  # its own folder


def test_of_two_folders_agreeing_on_a_simulated_figure_the_newest_is_named():
    from kvbench.harness.report.service_plots import max_rate_table
    from kvbench.harness.report.summary import rate_headlines

    rows = pd.DataFrame([{**ENV, "device_slug": slug, "run_dir": f"results/{slug}/m/0", "scenario": "max_rate",
                          "model": "m", "workload": "chat", "dtype": "float32", "batch": 32, "max_seq_len": 512,
                          "arrival": "poisson", "slo": "s", "clock": "simulated", "gpu": "1x h200", "impl": impl,
                          "max_rate_rps": r, "probes": 3, "measured_at": at}
                         for slug, at in (("cpu-a", "2026-01-01T00:00:00+00:00"), ("cpu-b", "2026-06-01T00:00:00+00:00"))
                         for impl, r in (("contiguous", 2.0), ("paged_torch", 6.0))])
    (said,) = rate_headlines(Collection(rows, pd.DataFrame()), max_rate_table(rows))
    assert said.run_dir == "results/cpu-b/m/0"


def test_a_headline_from_stale_rows_says_so():
    col = _collection()
    col.rows["stale"] = [None] * 3 + ["code changed since abc1234 (3 commits, 2 code files)"] * 3
    text = "\n".join(answer_section(col, ["memory_vs_concurrency", "max_concurrency"], has_max_rate=True))
    rate = next(line for line in text.splitlines() if "max rate within the SLO" in line)
    concurrency = next(line for line in text.splitlines() if "max concurrency" in line)
    assert "**stale**: code changed since abc1234" in rate and "stale" not in concurrency


def test_no_concurrency_ratio_is_claimed_where_batch_capped_contiguous():
    # a newcomer's capacity run: batch=100 capped both caches, and the answer said "paged fits >= 1.00x more"
    from kvbench.harness.report.memory_plots import concurrency_table
    from kvbench.harness.report.summary import concurrency_headlines

    rows = pd.DataFrame([
        {**ENV, "run_dir": f"results/x/capacity/{impl}", "scenario": "capacity", "model": "llama-2-7b",
         "workload": "seeds", "max_seq_len": 2048, "budget_kv_bytes": 111.7e9, "impl": impl, "batch": 100,
         "max_concurrency": 100, "max_concurrency_analytic": predicted}
        for impl, predicted in (("contiguous", 103), ("paged_torch", 415))])
    col = Collection(rows, pd.DataFrame())
    assert concurrency_headlines(col, concurrency_table(rows)) == []
    budget_bound = rows.assign(max_concurrency=[60, 100])  # contiguous stopped by the budget: paged's is a bound
    (said,) = concurrency_headlines(col, concurrency_table(budget_bound))
    assert said.value == "≥ 1.67×"


def test_the_kv_accounting_headline_cites_a_folder_this_code_measured():
    # two machines' capacity folders give the same figure; the one measured by older code (first by name) made the
    # published headline say "stale" though the other machine's fresh folder said the same
    from kvbench.harness.report.markdown import memory_points_table as points_table
    from kvbench.harness.report.summary import memory_headlines

    col = _collection()
    old = col.points.assign(run_dir="results/cpu-a/capacity/0")
    new = col.points.assign(run_dir="results/cpu-b/capacity/0")
    rows = pd.DataFrame([{**ENV, "run_dir": d, "scenario": "capacity", "model": "llama-2-7b", "impl": "paged_torch"}
                         for d in ("results/cpu-a/capacity/0", "results/cpu-b/capacity/0")])
    both = Collection(rows.assign(stale=["code changed since abc1234 (3 commits, 2 code files)", None]),
                      pd.concat([old, new], ignore_index=True))
    (said,) = memory_headlines(both, points_table(both.points))
    assert said.run_dir == "results/cpu-b/capacity/0"
    fresh_first = Collection(rows.assign(stale=[None, "code changed since abc1234"]), both.points)
    assert memory_headlines(fresh_first, points_table(both.points))[0].run_dir == "results/cpu-a/capacity/0"
