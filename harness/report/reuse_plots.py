"""Prefix-cache reuse: the hit rate a cache keeps against its size, per eviction policy and host tier, and TTFT against it.

Rows of workloads with reuse (``prefix_hit_rate_ideal`` above 0: multi-turn conversations, shared
system prompts, traces with block hashes) carry the hit rate the run achieved (prompt tokens served
from the device cache or the host tier at first admission, over every prompt token of the workload)
and the ideal one (an unbounded cache, from the workload alone). One panel per setting
(model, workload, clock, device): a line per eviction policy and tier against the KV cache's size,
the ideal dashed; then TTFT p50 against the hit rate, one point per run, to show what reuse buys.
"""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from kvbench.harness.report.selection import ok_rows
from kvbench.harness.report.figures import GB, MAX_FACETS, facet_labels, grid, single_point_facets, wrap

FACETS = ["model", "workload", "clock", "gpu", "block_size", "device_slug"]
ALWAYS = ("model", "workload", "clock")
POLICY_STYLE = {"lru": ("#4c72b0", "o"), "lfu": ("#dd8452", "s"), "2q": ("#55a868", "^")}


def reuse_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """Ok rows of workloads that reuse, with their KV size, policy and tier named."""
    df = pd.concat([ok_rows(rows, "decode"), ok_rows(rows, "capacity")])
    need = {"prefix_hit_rate", "prefix_hit_rate_ideal", "budget_kv_bytes"}
    if df.empty or not need <= set(df):
        return df.iloc[0:0]
    df = df[(pd.to_numeric(df["prefix_hit_rate_ideal"], errors="coerce") > 0) & df["prefix_hit_rate"].notna()]
    if df.empty:
        return df
    host = (pd.to_numeric(df["host_kv_gb"], errors="coerce").fillna(0) if "host_kv_gb" in df
            else pd.Series(0.0, index=df.index))  # no host tier column: no host tier
    policy = df["eviction"].fillna("lru").astype(str) if "eviction" in df else pd.Series("lru", index=df.index)
    return df.assign(kv_gb=df["budget_kv_bytes"].astype(float) / GB, policy=policy, host_gb=host,
                     line=[f"{p}" + (f" + {h:g} GB host" if h else "") for p, h in zip(policy, host)])


def _style(line: str) -> tuple[str, str, str]:
    policy = line.split(" ")[0]
    colour, marker = POLICY_STYLE.get(policy, ("0.4", "D"))
    return colour, marker, "--" if "host" in line else "-"


def _panels(df: pd.DataFrame):
    df = df.assign(facet=facet_labels(df, [c for c in FACETS if c in df], always=ALWAYS))
    facets = sorted(df["facet"].unique())[:MAX_FACETS]
    return df, facets


def hit_rate_vs_cache(rows: pd.DataFrame, left_out: list[str] | None = None) -> Figure | None:
    """The hit rate against the cache's size; a setting measured at one size only is a row of the section's
    table, not a panel, and is added to ``left_out`` with why (as are settings past ``MAX_FACETS``)."""
    left_out = [] if left_out is None else left_out
    df = reuse_rows(rows)
    if df.empty:
        return None
    df = df.assign(facet=facet_labels(df, [c for c in FACETS if c in df], always=ALWAYS))
    single = single_point_facets(df, "facet", "kv_gb")  # one cache size says nothing about size
    left_out += [f"{f} (one cache size only: its rows are in the table)" for f in single]
    facets = sorted(set(df["facet"]) - set(single))
    left_out += [f"{f} (past {MAX_FACETS} panels: its rows are in the table)" for f in facets[MAX_FACETS:]]
    facets = facets[:MAX_FACETS]
    if not facets:
        return None
    fig, axes = grid(len(facets), size=(5.4, 4.2))
    for ax, facet in zip(axes, facets):
        sub = df[df["facet"] == facet]
        for line, pts in sorted(sub.groupby("line")):
            pts = pts.groupby("kv_gb", as_index=False)["prefix_hit_rate"].median().sort_values("kv_gb")
            colour, marker, ls = _style(line)
            ax.plot(pts["kv_gb"], 100 * pts["prefix_hit_rate"], color=colour, marker=marker, ls=ls, label=line)
        ideal = 100 * float(sub["prefix_hit_rate_ideal"].median())
        ax.axhline(ideal, color="0.35", ls=":", lw=1.2, label=f"ideal (unbounded cache) {ideal:.1f}%")
        ax.set_title(wrap(facet))
        ax.set_xlabel("KV cache on the device (GB)")
        ax.set_ylabel("prefix hit rate (% of prompt tokens)")
        ax.set_ylim(0, max(5.0, 1.1 * max(ideal, 100 * float(sub["prefix_hit_rate"].max()))))
        ax.legend(fontsize=7, loc="best")
    fig.suptitle("Prefix hit rate vs KV cache size, per eviction policy and host tier\n"
                 "(dashed lines: with the host tier; dotted: the workload's ideal)")
    return fig


def ttft_vs_hit_rate(rows: pd.DataFrame) -> Figure | None:
    df = reuse_rows(rows)
    if df.empty or "ttft_ms_p50" not in df:
        return None
    df = df.dropna(subset=["ttft_ms_p50"])
    if len(df) < 2:
        return None
    df, facets = _panels(df)
    fig, axes = grid(len(facets), size=(5.4, 4.2))
    for ax, facet in zip(axes, facets):
        sub = df[df["facet"] == facet]
        for line, pts in sorted(sub.groupby("line")):
            colour, marker, _ = _style(line)
            ax.scatter(100 * pts["prefix_hit_rate"], pts["ttft_ms_p50"] / 1e3, color=colour, marker=marker,
                       facecolors="none" if "host" in line else colour, label=line, s=36)
        ax.set_title(wrap(facet))
        ax.set_xlabel("prefix hit rate (% of prompt tokens)")
        ax.set_ylabel("TTFT p50 (s)")
        ax.set_yscale("log")
        ax.legend(fontsize=7, loc="best")
    fig.suptitle("TTFT vs prefix hit rate: one point per run (cache size, policy, tier)\n"
                 "(hollow: with the host tier)")
    return fig


def reuse_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Each reuse run: its cache size, policy and tier, the hit rate (device, host) against the ideal, and TTFT."""
    df = reuse_rows(rows)
    if df.empty:
        return df
    keys = [k for k in ("device_slug", "model", "workload", "clock", "block_size", "kv_gb", "policy", "host_gb")
            if k in df]
    return df.sort_values(keys).reset_index(drop=True)
