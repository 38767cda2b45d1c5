"""REPORT.md: environments, headline tables, the figures, and the commands that made them."""

from __future__ import annotations

import pandas as pd

from kvbench.harness.report.attention_share import attention_section
from kvbench.harness.report.chunked_prefill import chunked_section
from kvbench.harness.report.clock_validation import clock_section
from kvbench.harness.report.published_clock import published_clock_section
from kvbench.harness.report.collect import Collection
from kvbench.harness.report.caveats import contended_section, mark_flagged, stale_section, unread_section
from kvbench.harness.report.page_one import PLOT_SENTENCES, page_one_section
from kvbench.harness.report.selection import burst, ok_rows, unique_points, with_mode
from kvbench.harness.report.figures import GB, devices
from kvbench.harness.report.hardware import with_peak
from kvbench.harness.report.kv_dtype import kv_dtype_section
from kvbench.harness.report.memory_plots import VARIANTS, breakdown_table, concurrency_table
from kvbench.harness.report.parity import parity_section
from kvbench.harness.report.reuse_plots import reuse_table
from kvbench.harness.report.service_plots import max_rate_table, service_table
from kvbench.harness.report.summary import Headline, concurrency_headlines, memory_headlines, rate_headlines
from kvbench.harness.report.tables import Markdown, cell, md_code, md_fence, md_table, md_text, pick
from kvbench.harness.report.units import readable_durations
from kvbench.harness.report.variance import DEFAULT_MAX_SPREAD, footnote, mark_spread


def _marked(df: pd.DataFrame, cols: dict[str, str], max_spread: float) -> tuple[pd.DataFrame, str]:
    """Like ``_pick``, with metrics whose repeats spread beyond ``max_spread`` marked; and the footnote."""
    shown, count = mark_spread(df, [c for c in cols if c in df.columns], max_spread, cell)
    return shown.rename(columns=cols), footnote(max_spread, count)


def environment_table(rows: pd.DataFrame) -> pd.DataFrame:
    cols = {"device_slug": "device slug", "device": "device", "gpu_name": "GPU", "cpu_name": "CPU",
            "torch_version": "torch", "triton_version": "triton", "cuda_version": "CUDA", "git_sha": "git sha",
            "git_dirty": "dirty"}
    keys = [c for c in cols if c in rows.columns]
    env = rows[keys].astype(object).where(rows[keys].notna(), None)
    env = env.assign(runs=rows["run_dir"]).groupby(keys, dropna=False)["runs"].nunique().reset_index()
    return pick(env.sort_values(keys), {**cols, "runs": "run folders"})


def status_table(rows: pd.DataFrame) -> pd.DataFrame:
    t = rows.groupby(["scenario", "status"], dropna=False).size().unstack(fill_value=0)
    return t.reset_index()


def memory_points_table(points: pd.DataFrame) -> pd.DataFrame:
    """Per setting: memory per variant at the most concurrent requests contiguous serves within budget."""
    pts = unique_points(points)
    if pts.empty:
        return pts
    out = []
    keys = [c for c in ("model", "workload", "max_seq_len", "block_size", "budget_kv_bytes") if c in pts]
    for key, sub in pts.groupby(keys, dropna=False):
        wide = sub.pivot_table(index="concurrency", columns="variant", values="kv_bytes_reserved", aggfunc="first")
        if "contiguous" not in wide:
            continue
        fits = wide.index[wide["contiguous"] <= sub["budget_kv_bytes"].iloc[0]]
        n = fits.max() if len(fits) else wide.index.min()
        rec = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        rec["budget_kv_bytes"] = rec.get("budget_kv_bytes", float("nan")) / GB
        rec["requests"] = n
        # where even the fewest requests overflow the budget, the row says so rather than sit under "fits"
        rec["contiguous fits the budget"] = "yes" if len(fits) else "no: over the budget at the fewest requests"
        for v in VARIANTS:
            if v in wide:
                rec[f"{v} GB"] = wide.at[n, v] / GB
        if "paged" in wide:
            rec["saved by paging GB"] = (wide.at[n, "contiguous"] - wide.at[n, "paged"]) / GB
        out.append(rec)
    return pd.DataFrame(out).rename(columns={"budget_kv_bytes": "KV budget GB"})


def decode_table(rows: pd.DataFrame, max_spread: float = DEFAULT_MAX_SPREAD) -> tuple[pd.DataFrame, str]:
    df = mark_flagged(with_mode(burst(ok_rows(rows, "decode"))))  # arrival-process rows: the service table
    df = df.assign(used_pct=100 * df["kv_used_fraction"])
    cols = {"device_slug": "device", "model": "model", "workload": "workload", "impl": "impl", "mode": "mode",
            "batch": "batch",
            "output_tokens_per_s": "output tok/s", "tokens_per_s": "tok/s", "tokens_per_s_spread": "tok/s spread",
            "step_ms_p50": "step p50 ms", "ttft_ms_p50": "TTFT p50 ms", "preemptions": "preemptions",
            "used_pct": "KV used %", "run_dir": "run"}
    df, cols = readable_durations(df, cols)
    return _marked(df.sort_values(["device_slug", "model", "workload", "impl", "mode", "batch", "run_dir"]), cols,
                   max_spread)


def kernel_table(rows: pd.DataFrame) -> pd.DataFrame:
    df = mark_flagged(ok_rows(rows, "kernel"))
    cols = {"device_slug": "device", "impl": "impl", "layout": "layout", "dtype": "dtype", "block_size": "block",
            "kernel_batch": "batch", "context_len": "context", "latency_us_p50": "latency p50 µs",
            "bandwidth_gbps": "GB/s", "frac_peak_bw": "of peak", "frac_copy_bw": "of copy"}
    keys = [c for c in ("device_slug", "impl", "block_size", "kernel_batch", "context_len") if c in df]
    return pick(df.sort_values(keys), cols)


def gpu_table(rows: pd.DataFrame, max_spread: float = DEFAULT_MAX_SPREAD) -> tuple[pd.DataFrame, str]:
    df = mark_flagged(with_peak(burst(ok_rows(rows, "decode")).dropna(subset=["output_tokens_per_s"])))
    df["per_tbps"] = df["output_tokens_per_s"] / df["peak_tbps"]
    cols = {"device_slug": "device", "gpu_name": "GPU", "peak_tbps": "peak TB/s", "model": "model", "impl": "impl",
            "batch": "batch", "output_tokens_per_s": "output tok/s", "per_tbps": "tok/s per TB/s"}
    return _marked(df.sort_values(["model", "impl", "batch", "device_slug"]), cols, max_spread)


SERVICE_COLUMNS = {
    "device_slug": "device", "model": "model", "workload": "workload", "arrival": "arrival",
    # The clock the latencies were taken on, and the GPU a simulated one models: the device_slug of a
    # simulated row is the machine that ran the simulator, not the GPU its latencies are of.
    "clock": "clock", "gpu": "simulated GPU", "impl": "impl",
    "batch": "batch", "request_rate": "offered req/s", "achieved_rps": "achieved req/s",
    "ttft_ms_p99": "TTFT p99 ms", "tpot_ms_p99": "TPOT p99 ms", "e2el_ms_p99": "E2E p99 ms",
    "queue_ms_p99": "queue p99 ms", "normalized_latency_s": "normalized latency s/token",
    "goodput_rps": "goodput req/s", "slo": "SLO", "slo_attainment": "SLO attainment", "slo_pass": "SLO pass",
    "run_dir": "run",
}


def max_rate_markdown(rows: pd.DataFrame) -> str:
    """The max-rate table with each impl's rate as a multiple of contiguous's (empty without max_rate rows)."""
    t = max_rate_table(rows)
    if t.empty:
        return ""
    t = t.assign(ratio=t["ratio"].map(lambda r: "–" if pd.isna(r) else f"{r:.2f}×"))
    if "gpu" in t and t["gpu"].isna().all():  # wall-clock runs only: no simulated GPU to name
        t = t.drop(columns="gpu")
    if "mode" in t and (t["mode"] == "eager").all():  # no CUDA-graph runs: nothing to tell apart
        t = t.drop(columns="mode")
    return ("The largest offered rate at which each impl passed the SLO (median over runs), and its ratio to "
            "contiguous at the same setting; the paper's headline is 2-4× for paging.\n\n"
            + md_table(pick(t, {"device_slug": "device", "model": "model", "workload": "workload",
                                 "batch": "batch", "arrival": "arrival", "slo": "SLO", "mode": "mode", "impl": "impl",
                                 "gpu": "simulated GPU", "max_rate_rps": "max rate req/s", "ratio": "vs contiguous",
                                 "probes": "probes", "runs": "runs"})))


def _figure(name: str, title: str) -> str:
    return f"![{title}](plots/{name}.png)\n\n[SVG](plots/{name}.svg)\n"


SECTIONS = [
    ("memory_vs_concurrency", "KV memory needed vs concurrent requests"),
    ("memory_vs_concurrency_more", "KV memory needed vs concurrent requests: the other settings"),
    ("kv_breakdown", "KV memory breakdown per impl"),
    ("max_concurrency", "Max concurrency: measured vs predicted"),
    ("decode_throughput", "Decode throughput vs batch"),
    ("normalized_latency", "Normalized latency vs request rate"),
    ("goodput", "Goodput vs request rate"),
    ("kv_over_time", "KV memory over time"),
    ("kernel_latency_bandwidth", "Kernel latency and bandwidth vs context length"),
    ("reuse_hit_rate", "Prefix hit rate vs KV cache size, per eviction policy and host tier"),
    ("reuse_ttft", "TTFT vs prefix hit rate"),
    ("gpu_comparison", "Across GPUs"),
]


# The pure-torch kernel is the oracle every kernel is tested against, written to be read, not to be fast.
REFERENCE_IMPLS = ("paged_torch", "paged_flex")
REFERENCE_NOTE = ("`paged_torch` is the pure-torch reference (the readable oracle every kernel is tested against, "
                  "marked *reference* below), and `paged_flex` torch's FlexAttention over the same pages (on a CPU its "
                  "eager path, a gather and a masked SDPA), not optimised kernels: their speed is not what paging costs; "
                  "compare `paged_cuda` and `paged_triton` with `contiguous`.\n\n")


def as_reference(table: pd.DataFrame) -> pd.DataFrame:
    """The table with each reference impl's name marked, so no reader takes its speed for paging's."""
    if "impl" not in table:
        return table
    return table.assign(impl=table["impl"].map(lambda i: f"{i} (reference)" if i in REFERENCE_IMPLS else i))


def _section_table(name: str, col: Collection, max_spread: float) -> str:
    if name == "memory_vs_concurrency":
        return ("Memory at the largest concurrency whose contiguous cache fits the KV budget (where it fits at "
                "none, at the fewest requests measured, and the last column says so):\n\n"
                + md_table(memory_points_table(col.points)))
    if name == "kv_breakdown":
        t = breakdown_table(col.rows)
        t = t.assign(held=t["held_bytes"] / GB, frag=100 * t["kv_fragmentation_bytes"] / t["held_bytes"],
                     waste=100 * t["kv_reservation_waste_bytes"] / t["held_bytes"])
        parts = "token states + fragmentation + reservation waste = memory held then"
        if t["kv_external_fragmentation_bytes"].any():  # variable-size reservations among the impls
            t = t.assign(external=100 * t["kv_external_fragmentation_bytes"] / t["held_bytes"])
            parts = ("token states + fragmentation + reservation waste + external fragmentation (free, in holes"
                     " too small for the first waiting request) = memory held or stranded then")
        return (f"At the snapshot with the most token states ({parts}):\n\n"
                + md_table(pick(t, {
                    "scenario": "scenario", "device_slug": "device", "model": "model", "workload": "workload",
                    "batch": "batch", "impl": "impl", "held": "held GB", "used_pct": "token states %",
                    "frag": "fragmentation %", "waste": "reservation waste %",
                    "external": "external fragmentation %"})))
    if name == "max_concurrency":
        t = concurrency_table(col.rows)
        return md_table(pick(t, {"scenario": "source", "device_slug": "device", "model": "model",
                                  "workload": "workload", "impl": "impl", "batch": "batch limit",
                                  "max_concurrency": "measured", "max_concurrency_analytic": "predicted",
                                  "capped": "hit batch limit"}))
    if name == "decode_throughput":
        table, note = decode_table(col.rows, max_spread)
        return REFERENCE_NOTE + md_table(as_reference(table)) + note
    if name == "normalized_latency":
        service = mark_flagged(service_table(col.rows))
        if "gpu" in service and service["gpu"].isna().all():  # wall-clock runs only: no simulated GPU to name
            service = service.drop(columns="gpu")
        service, headers = readable_durations(service, SERVICE_COLUMNS)
        table, note = _marked(service, headers, max_spread)
        return ("Offered and achieved rates, latency percentiles over requests (vLLM's definitions), "
                "the paper's normalized latency, and the SLO's goodput:\n\n" + md_table(table) + note)
    if name == "kv_over_time":
        return ("From the run folder's `steps` table: dashed, the KV memory the cache held; solid, the part "
                "holding token states.\n")
    if name == "kernel_latency_bandwidth":
        return REFERENCE_NOTE + md_table(as_reference(kernel_table(col.rows)))
    if name == "reuse_hit_rate":
        t = reuse_table(col.rows)
        t = t.assign(hit=t["prefix_hit_rate"].map(lambda v: f"{100 * v:.1f}%"),
                     ideal=t["prefix_hit_rate_ideal"].map(lambda v: f"{100 * v:.1f}%"),
                     ttft_s=(t["ttft_ms_p50"] / 1e3) if "ttft_ms_p50" in t else None)
        return ("Prompt tokens served from the prefix cache (the device's, then the host tier's) at each request's "
                "first admission, over every prompt token of the workload; as in vLLM, a prompt's last token is "
                "always computed. The ideal is an unbounded cache's, from the workload alone.\n\n"
                + md_table(pick(t, {"device_slug": "device", "model": "model", "workload": "workload",
                                    "clock": "clock", "block_size": "block", "kv_gb": "KV GB", "policy": "eviction",
                                    "host_gb": "host tier GB", "hit": "hit rate", "ideal": "ideal",
                                    "host_hit_tokens": "host-hit tokens", "evicted_blocks": "evicted blocks",
                                    "recomputed_tokens": "recomputed tokens", "ttft_s": "TTFT p50 s"})))
    if name == "reuse_ttft":
        return ("A host tier copies its hits back, and the evicted blocks out, over the host link before the step "
                "that needs them (no overlap with compute; `host_copy`): where hits are rare the stores cost more "
                "than the hits save.\n")
    if name == "gpu_comparison":
        table, note = gpu_table(col.rows, max_spread)
        return ("Peak bandwidth from conf/gpu/ (each GPU's datasheet figure), else the row's "
                "peak_bw_gbps.\n\n" + md_table(table) + note)
    return ""


def anchor(title: str) -> str:
    """The link target GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    kept = "".join(ch for ch in title.lower() if ch.isalnum() or ch in " -_")
    return kept.strip().replace(" ", "-")


def command_anchor(run_dir: str) -> str:
    return "cmd-" + "".join(ch if ch.isalnum() else "-" for ch in run_dir.lower())


MAX_RATE_TITLE = "Max request rate under the SLO"


def section_titles(drawn: list[str]) -> dict[str, str]:
    """Each drawn section's heading as rendered (numbered in drawing order), and the max-rate section's."""
    titles = {name: f"{i}. {title}" for i, (name, title) in enumerate([s for s in SECTIONS if s[0] in drawn], 1)}
    return {**titles, "max_rate": MAX_RATE_TITLE}


def headlines(col: Collection) -> list[Headline]:
    return (memory_headlines(col, memory_points_table(col.points)) + concurrency_headlines(col, concurrency_table(col.rows))
            + rate_headlines(col, max_rate_table(col.rows)))


def answer_section(col: Collection, drawn: list[str], has_max_rate: bool) -> list[str]:
    """REPORT.md's first section: what paging buys, per device and model, each figure linked to its evidence."""
    found = headlines(col)
    if not found:
        return []
    titles = section_titles(drawn)
    available = set(drawn) | ({"max_rate"} if has_max_rate else set())
    # The cells hold kvbench's own markup around the folder's text, which is escaped (harness/report/tables.py).
    table = pd.DataFrame([{
        "device": h.device, "model": h.model,
        "paging buys": Markdown(f"**{md_text(h.value)}** {md_text(h.fact)}"),
        "how": Markdown(md_text(h.detail) + (f"; **stale**: {md_text(why)}"
                                             if (why := _stale_reason(col.rows, h.run_dir)) else "")),
        "section": (Markdown(f"[{md_text(titles[h.section])}](#{anchor(titles[h.section])})")
                    if h.section in available else "–"),
        "command": Markdown(f"[{md_code(h.run_dir)}](#{command_anchor(h.run_dir)})") if h.run_dir else "–",
    } for h in found])
    return ["## What paging buys\n",
            "Each figure is the best paged impl against contiguous at one setting; its section has the rest, "
            "and its command re-makes it. The KV accounting does not depend on the device; a simulated GPU's "
            "figures come from the simulated clock, not from that GPU.\n",
            md_table(table)]


def _stale_reason(rows: pd.DataFrame, run_dir: str | None) -> str | None:
    """Why a headline's run folder no longer describes this checkout (harness/report/stale.py), if it does not."""
    if run_dir is None or "stale" not in rows:
        return None
    why = rows.loc[rows["run_dir"] == run_dir, "stale"].dropna()
    return str(why.iloc[0]) if len(why) else None


def render(col: Collection, drawn: list[str], command: str, notes: dict[str, list[str]],
           max_spread: float = DEFAULT_MAX_SPREAD, tabled: list[str] | tuple[str, ...] = ()) -> str:
    """REPORT.md: the summary and the plots first (page one answers the question), then the evidence behind
    them. ``drawn``: the figures saved; ``tabled``: sections with no figure (one point per setting) whose
    rows are their table; ``notes``: per section, what its figure left out and why."""
    rows = col.rows
    max_rate = max_rate_markdown(rows)
    shown = [name for name, _ in SECTIONS if name in drawn or name in tabled]
    titles = section_titles(shown)
    parts = [
        "# kvbench report\n",
        f"{len(rows)} rows from {rows['run_dir'].nunique()} run folders on {md_text(devices(rows))}. "
        "Tables: `all_runs.parquet` / `all_runs.csv`"
        + (", `all_points.parquet` / `all_points.csv`" if not col.points.empty else "") + ".\n",
        *page_one_section(col, [(titles[n], anchor(titles[n]), n) for n in shown]),
        "Regenerate this report with:\n",
        f"{md_fence(command)}\n",
        *answer_section(col, shown, bool(max_rate)),
    ]
    for name, title in [s for s in SECTIONS if s[0] in shown]:
        parts += [f"## {titles[name]}\n", PLOT_SENTENCES.get(name, "") + "\n"]
        parts.append(_figure(name, title) if name in drawn else
                     "No plot: every setting has a single point, so its rows are the table below.\n")
        if notes.get(name):
            parts.append("Left out of the figure, each with why: " + "; ".join(map(md_text, notes[name])) + ".\n")
        if name == "memory_vs_concurrency" and "memory_vs_concurrency_more" in shown:
            parts.append("The seeds' experiment first, then the other settings at block 16; the rest (the "
                         "block-size sweep among them) are in the next figure.\n")
            continue  # one table for both figures, after the second
        if name == "memory_vs_concurrency_more":
            parts.append(_section_table("memory_vs_concurrency", col, max_spread))
            continue
        parts.append(_section_table(name, col, max_spread))
    if max_rate:
        parts += [f"## {MAX_RATE_TITLE}\n", max_rate]
    parts += kv_dtype_section(rows)
    parts += clock_section(rows, col.steps)
    parts += published_clock_section(rows)
    parts += chunked_section(rows)
    parts += attention_section(rows)
    parts += [
        "## Environment\n",
        md_table(environment_table(rows)),
        "## Rows by scenario and status\n",
        "Rows whose status is not `ok` stay in the tables and are left out of every plot.\n",
        md_table(status_table(rows)),
    ]
    failed = rows[rows["status"] != "ok"]
    if len(failed):
        failed = failed.assign(error=failed["error"].map(lambda e: e if not isinstance(e, str) else e[:160]))
        parts += ["Rows not ok:\n", md_table(pick(failed, {"run_dir": "run", "scenario": "scenario", "impl": "impl",
                                                            "batch": "batch", "device_slug": "device",
                                                            "status": "status", "error": "error"}))]
    parts += unread_section(col)
    parts += stale_section(rows)
    parts += contended_section(rows)
    parts += parity_section(rows, col.folders)
    parts.append("## Commands that produced the runs\n")
    if not col.commands:
        parts.append("_No run folder recorded its overrides (.hydra/overrides.yaml)._\n")
    for scenario in sorted({c.scenario for c in col.commands}):
        parts.append(f"### {md_text(scenario)}\n")
        for c in sorted((c for c in col.commands if c.scenario == scenario), key=lambda c: c.run_dir):
            parts.append(f'<a id="{command_anchor(c.run_dir)}"></a>{md_code(c.run_dir)}:\n\n{md_fence(c.command)}\n')
    return "\n".join(parts)
