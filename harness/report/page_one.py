"""REPORT.md's first screen: per cache, its memory on the paper's workload, how many requests it fits in a budget,
its throughput there, and the machine; then what each plot shows, in one sentence.

Every figure comes from the rows and points (never written in here); where one is missing, or where ``batch``
(the most sequences a run admits) stopped the search before the budget did, the table says so in words
instead of quoting a number that answers another question.
"""

from __future__ import annotations

import pandas as pd

from kvbench.harness.report.collect import Collection
from kvbench.harness.report.figures import fmt_bytes
from kvbench.harness.report.memory_plots import SEEDS_EXPERIMENT, concurrency_table
from kvbench.harness.report.selection import ANY_DEVICE, burst, contended_rows, ok_rows, unique_points
from kvbench.harness.report.summary import SEEDS_WORKLOAD, is_paged
from kvbench.harness.report.tables import md_table, md_text

PAPER_REQUESTS = int(SEEDS_EXPERIMENT["batch"])  # the paper's figure: 100 requests served at once
PAPER_MODEL = str(SEEDS_EXPERIMENT["model"])
FLAG = " ⚑"  # a figure with a row measured while the machine was busy (``contended``)

# What each plot shows, one sentence, in REPORT.md's words (the section names are markdown.py's SECTIONS).
PLOT_SENTENCES: dict[str, str] = {
    "memory_vs_concurrency": "KV memory each cache reserves as concurrent requests grow, against the KV budget: "
                             "the gap is what paging saves.",
    "memory_vs_concurrency_more": "The same for the other settings (block sizes, models, workloads).",
    "kv_breakdown": "Which share of the KV memory held holds token states, and which is fragmentation or "
                    "reservation waste, per cache.",
    "max_concurrency": "The most requests each cache admitted in its KV budget, measured beside vLLM's formula.",
    "decode_throughput": "Output tokens per second as the batch grows, per cache, on each machine.",
    "normalized_latency": "Latency per output token as the offered request rate grows (PagedAttention Fig. 12).",
    "goodput": "Requests per second that met the SLO as the offered rate grows.",
    "kv_over_time": "KV memory held, and the part holding token states, step by step through one run.",
    "kernel_latency_bandwidth": "Decode attention kernel latency and achieved bandwidth as the context grows.",
    "reuse_hit_rate": "Share of prompt tokens served from the prefix cache as the cache grows, per eviction policy "
                      "and host tier.",
    "reuse_ttft": "Time to first token against the prefix hit rate.",
    "gpu_comparison": "The same impls on each machine, raw and per TB/s of peak memory bandwidth.",
}


def paper_memory(points: pd.DataFrame) -> dict[str, float]:
    """Bytes each points variant (contiguous, paged, paged_shared) reserves for ``PAPER_REQUESTS`` requests of
    the paper's workload (Llama-2-7B, the ``seeds`` workload); empty when no capacity run measured it."""
    pts = unique_points(points)
    if pts.empty or not {"model", "workload", "concurrency", "variant", "kv_bytes_reserved"} <= set(pts.columns):
        return {}
    at = pts[(pts["model"] == PAPER_MODEL) & (pts["workload"] == SEEDS_WORKLOAD)
             & (pts["concurrency"] == PAPER_REQUESTS)]
    return {str(v): float(b) for v, b in at.groupby("variant")["kv_bytes_reserved"].first().items()}


def _variant(impl: str) -> str | None:
    """The points variant that stores a cache's KV as the impl does (Orca's reservations have none)."""
    return "contiguous" if impl == "contiguous" else ("paged" if is_paged(impl) else None)


SETTING = ["scenario", "model", "workload", "max_seq_len", "budget_kv_bytes", "kv_manager", "device_slug"]


def _settings(table: pd.DataFrame) -> list[pd.DataFrame]:
    """Each concurrency setting's rows, best answer first: one that runs contiguous beside a paged cache (a setting
    of paged caches alone says nothing of what paging buys), the budget bound every impl (no ``capped``), a
    search (``scenario=max_concurrency``) before the capacity simulation, the paper's model and workload first;
    the capacity simulation's rows, the same on every machine, once."""
    keys = [c for c in SETTING if c in table]
    table = table.assign(device_slug=table["device_slug"].where(table["scenario"] != "capacity", ANY_DEVICE))
    table = table.drop_duplicates(subset=[*keys, "impl"])
    groups = [sub for _, sub in table.groupby(keys, dropna=False, sort=True)]

    def rank(sub: pd.DataFrame) -> tuple:
        first = sub.iloc[0]
        return (not (sub["impl"] == "contiguous").any(), bool(sub["capped"].any()), first["scenario"] != "max_concurrency",
                (first["model"], first["workload"]) != (PAPER_MODEL, SEEDS_WORKLOAD))
    return sorted(groups, key=rank)


def _setting_words(r: pd.Series) -> str:
    budget = r.get("budget_kv_bytes")
    return (f"{r['model']}, {r['workload']} workload, KV budget "
            f"{fmt_bytes(budget) if pd.notna(budget) else 'unknown'}")


def _throughput(rows: pd.DataFrame, device: str, model: str, impl: str, n: float) -> str:
    """The median output tokens/s of ``impl``'s decode runs at batch ``n`` on ``device``, else why there is none."""
    if device == ANY_DEVICE:
        return "– (KV accounting: no machine's speed)"
    decode = burst(ok_rows(rows, "decode"))
    if not {"output_tokens_per_s", "batch"} <= set(decode.columns):
        return "not measured (no decode run)"
    decode = decode.dropna(subset=["output_tokens_per_s", "batch"])
    mine = decode[(decode["device_slug"] == device) & (decode["model"] == model) & (decode["impl"] == impl)]
    at = mine[mine["batch"] == n]
    if at.empty:
        ran = ", ".join(f"{b:g}" for b in sorted(mine["batch"].unique()))
        return f"not measured at batch {n:g}" + (f" (decode ran at batch {ran})" if ran else " (no decode run)")
    flag = FLAG if contended_rows(at).any() else ""
    return f"{at['output_tokens_per_s'].median():.4g} output tok/s{flag}"


def _batch_bound_words(settings: list[pd.DataFrame]) -> list[str]:
    """Where ``batch`` stopped a count before the budget: said in full for the paper's workload, counted for
    the rest (a count at its batch limit is a lower bound, and a ratio of two such counts says nothing)."""
    paper = [sub for sub in settings if (sub.iloc[0]["model"], sub.iloc[0]["workload"]) == (PAPER_MODEL, SEEDS_WORKLOAD)]
    words = []
    for sub in paper:
        capped = sub[sub["capped"]]
        caps = ", ".join(sorted({f"{b:g}" for b in capped["batch"].dropna()}))
        predicted = "; ".join(f"{md_text(r['impl'])} {r['max_concurrency_analytic']:.0f}" for _, r in sub.iterrows()
                              if pd.notna(r["max_concurrency_analytic"]))
        words.append(f"On the paper's workload ({md_text(_setting_words(sub.iloc[0]))}) `batch={caps}` stopped "
                     f"{', '.join(map(md_text, capped['impl']))} before the budget did: the runs say each fits at least that many, "
                     "not how many more paging fits"
                     + (f"; the KV accounting predicts {predicted} requests." if predicted else "."))
    rest = [sub for sub in settings if not any(sub is p for p in paper)]
    if rest:
        names = "; ".join(md_text(f"{sub.iloc[0]['model']} {sub.iloc[0]['workload']}") for sub in rest)
        words.append(f"{len(rest)} other setting{'s' if len(rest) > 1 else ''} hit `batch` before the budget too "
                     f"({names}): not quoted here.")
    return words


def summary_table(col: Collection) -> tuple[pd.DataFrame, list[str]]:
    """Page one's table (one row per machine and cache, from the best concurrency setting of each machine) and
    its sentences (Markdown, the folders' text escaped): what is missing, and where ``batch`` bound the
    concurrency rather than the budget."""
    memory = paper_memory(col.points)
    words: list[str] = []
    if not memory:
        words.append(f"No capacity run of the paper's workload ({PAPER_MODEL}, `workload={SEEDS_WORKLOAD}`) "
                     f"reached {PAPER_REQUESTS} concurrent requests: the memory column is empty.")
    # the search's rows and the capacity simulation's, both (the section's table shows the search's alone)
    tables = [concurrency_table(col.rows[col.rows["scenario"] == scenario]) for scenario in ("max_concurrency", "capacity")]
    table = pd.concat([t for t in tables if not t.empty], ignore_index=True) if any(len(t) for t in tables) \
        else pd.DataFrame()
    out, machines, bound_by_batch = [], set(), []
    for sub in (_settings(table) if not table.empty else []):
        first = sub.iloc[0]
        device = str(first["device_slug"])
        bound = bool(sub["capped"].any())
        if bound:
            bound_by_batch.append(sub)
        if device in machines or (bound and machines):
            continue  # one setting per machine, and a batch-bound one only where nothing better exists
        machines.add(device)
        for _, r in sub.iterrows():
            impl, n = str(r["impl"]), r["max_concurrency"]
            variant = _variant(impl)
            out.append({
                "machine": device, "cache": impl,
                "memory": (fmt_bytes(memory[variant]) if variant in memory else "–"),
                "max concurrency": (f"≥ {n:.0f} (batch bound, not the budget)" if bool(r["capped"])
                                    else f"{n:.0f}") + f" ({_setting_words(r)})",
                "throughput": _throughput(col.rows, device, str(r["model"]), impl, n),
            })
    words += _batch_bound_words(bound_by_batch)
    if table.empty:
        words.append("No run measured a max concurrency (`scenario=max_concurrency`, or `scenario=capacity` with "
                     "a KV budget): the concurrency and throughput columns are empty.")
        out = [{"machine": ANY_DEVICE, "cache": v, "memory": fmt_bytes(b), "max concurrency": "–",
                "throughput": "–"} for v, b in memory.items()]
    return pd.DataFrame(out), words


def page_one_section(col: Collection, plots: list[tuple[str, str, str]]) -> list[str]:
    """REPORT.md's first section: the summary table, its sentences, then each plot's link (``plots``: its
    heading, the heading's anchor, and its section's name) with one sentence of what it shows."""
    table, words = summary_table(col)
    parts = ["## Summary\n",
             f"Per cache: the KV memory it reserves for {PAPER_REQUESTS} concurrent requests of the paper's workload "
             f"({PAPER_MODEL}, `workload={SEEDS_WORKLOAD}`; the KV accounting, the same on any machine), the most "
             "requests it admitted in a KV budget, its decode throughput at that many, and the machine.\n"]
    if not table.empty:
        parts.append(md_table(table.rename(columns={
            "memory": f"KV memory at {PAPER_REQUESTS} requests ({PAPER_MODEL})",
            "max concurrency": "max concurrency under the KV budget",
            "throughput": "decode throughput at that concurrency"})))
    parts += [f"- {w}" for w in words]  # kvbench's markdown, the folders' text in it escaped where it was made
    if words:
        parts.append("")
    if table.astype(str).apply(lambda c: c.str.endswith(FLAG)).any().any():
        parts.append(f"{FLAG.strip()}: measured while the machine was busy (flagged; see the rows measured under "
                     "contention).\n")
    if plots:
        parts.append("The plots:\n")
        parts.append("\n".join(f"- [{md_text(title)}](#{target}): {PLOT_SENTENCES.get(name, '')}"
                               for title, target, name in plots) + "\n")
    return parts
