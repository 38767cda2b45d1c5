"""Speed figures: decode throughput, kernel latency and bandwidth, and the cross-GPU comparison."""

from __future__ import annotations

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from harness.report.collect import MODES, burst, ok_rows, with_mode
from harness.report.figures import (
    MAX_FACETS, count_axis, drop_legend, facet_labels, grid, legend_outside, wrap,
)
from harness.report.hardware import with_peak

# min-max over runs: deterministic, unlike a bootstrapped confidence interval
SPREAD = ("pi", 100)
BARS = {"errorbar": SPREAD, "err_style": "bars", "err_kws": {"capsize": 3}}


def decode_throughput(rows: pd.DataFrame, palette: dict) -> Figure | None:
    """Plot 4: output tokens/s vs batch, one line per impl (dashed: with CUDA graphs, when both ran)."""
    df = with_mode(burst(ok_rows(rows, "decode")).dropna(subset=["output_tokens_per_s", "batch"]))
    if df.empty:
        return None
    df["facet"] = facet_labels(df, ["model", "workload", "dtype", "device_slug"],
                               always=("model", "workload", "device_slug"))
    facets = sorted(df["facet"].unique())[:MAX_FACETS]
    fig, axes = grid(len(facets), size=(5.4, 4.0))
    # One style for every panel (the last one's legend explains it): by mode when any rows replayed graphs.
    by_mode = bool((df["mode"] != "eager").any())
    style = {"style": "mode", "style_order": MODES} if by_mode else {"style": "impl"}
    for i, (ax, facet) in enumerate(zip(axes, facets)):
        sub = df[df["facet"] == facet]
        sns.lineplot(data=sub, x="batch", y="output_tokens_per_s", hue="impl", **style, markers=True,
                     markersize=8, palette=palette, hue_order=sorted(sub["impl"].unique()), **BARS, ax=ax)
        count_axis(ax, sub["batch"])
        ax.set_title(wrap(facet))
        ax.set_xlabel("batch (max concurrent sequences)")
        ax.set_ylabel("output tokens/s")
        ax.set_ylim(bottom=0)
        legend_outside(ax, "impl") if i == len(facets) - 1 else drop_legend(ax)
    fig.suptitle("Decode throughput vs batch (bars: min-max over runs)")
    return fig


def _gbps(v: float) -> str:
    return f"{v:.0f}" if v >= 100 else f"{v:.3g}"


def _rooflines(ax, sub: pd.DataFrame) -> None:
    """Horizontal lines at the peak (row, else datasheet) and the measured copy bandwidth."""
    peak = sub["peak_bw_gbps"].dropna() if "peak_bw_gbps" in sub else pd.Series(dtype=float)
    label = "peak"
    if peak.empty:
        peak = with_peak(sub)["peak_tbps"].dropna() * 1000
        label = "datasheet peak"
    if len(peak):
        ax.axhline(peak.median(), color="black", ls="--", lw=1.2, label=f"{label} {_gbps(peak.median())} GB/s")
    copy = sub["copy_bw_gbps"].dropna() if "copy_bw_gbps" in sub else pd.Series(dtype=float)
    if len(copy):
        ax.axhline(copy.median(), color="0.4", ls=":", lw=1.5, label=f"measured copy {_gbps(copy.median())} GB/s")


def _variant(row: pd.Series) -> str:
    """The line style of a kernel row: its cache layout and block size (a contiguous cache has none)."""
    parts = [str(row["layout"])] if "layout" in row and isinstance(row["layout"], str) else []
    if not pd.isna(row.get("block_size")):
        parts.append(f"block {row['block_size']:g}")
    return " · ".join(parts) or "-"


def kernel_latency_bandwidth(rows: pd.DataFrame, palette: dict) -> Figure | None:
    """Plot 5: latency and achieved bandwidth vs context length (hue impl, style block size)."""
    df = ok_rows(rows, "kernel")
    if df.empty or "context_len" not in df:
        return None
    df = df.dropna(subset=["context_len"]).dropna(subset=["latency_us_p50", "bandwidth_gbps"], how="all")
    if df.empty:
        return None
    df["variant"] = [_variant(r) for _, r in df.iterrows()]
    if {"num_heads", "num_kv_heads", "head_dim"} <= set(df.columns):
        df["shape"] = [f"{h:g}/{kv:g} heads × {d:g}" for h, kv, d in zip(df["num_heads"], df["num_kv_heads"], df["head_dim"])]
    cols = [c for c in ("device_slug", "kernel_batch", "shape", "dtype") if c in df]
    df["facet"] = facet_labels(df, cols, always=tuple(cols))
    order = [c for c in ("device_slug", "kernel_batch", "facet") if c in df]
    facets = list(df.sort_values(order)["facet"].unique())[:MAX_FACETS]
    fig, axes = grid(2 * len(facets), ncols_max=2, size=(5.4, 3.6))
    impls, variants = sorted(df["impl"].unique()), sorted(df["variant"].unique())
    for r, facet in enumerate(facets):
        sub = df[df["facet"] == facet]
        lat, bw = axes[2 * r], axes[2 * r + 1]
        for ax, y, unit in ((lat, "latency_us_p50", "latency p50 (µs)"), (bw, "bandwidth_gbps", "achieved bandwidth (GB/s)")):
            sns.lineplot(data=sub, x="context_len", y=y, hue="impl", style="variant", hue_order=impls,
                         style_order=variants, palette=palette, markers=True, **BARS, ax=ax)
            count_axis(ax, sub["context_len"])
            ax.set_xlabel("context length (tokens)")
            ax.set_ylabel(unit)
            ax.set_title(wrap(facet))
        lat_vals = sub["latency_us_p50"].dropna()
        if len(lat_vals) and lat_vals.max() > 10 * lat_vals.min() > 0:
            lat.set_yscale("log")
        _rooflines(bw, sub)
        bw.set_ylim(bottom=0)
        drop_legend(lat)
        handles, labels = bw.get_legend_handles_labels()
        bw.legend(handles, [{"variant": "layout · block"}.get(lbl, lbl) for lbl in labels],
                  loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False, fontsize=8)
    fig.suptitle("Decode attention kernel vs context length (bars: min-max over runs)")
    return fig


def gpu_comparison(rows: pd.DataFrame, palette: dict) -> Figure | None:
    """Plot 6 (2+ devices): key metrics with one column per device, raw and normalised by peak bandwidth."""
    decode = with_peak(with_mode(burst(ok_rows(rows, "decode")).dropna(subset=["output_tokens_per_s", "batch"])))
    kernel = ok_rows(rows, "kernel")
    if "bandwidth_gbps" in kernel:
        kernel = with_peak(kernel.dropna(subset=["bandwidth_gbps", "context_len"]))
    else:
        kernel = kernel.iloc[0:0]
    devs = sorted(set(decode["device_slug"].dropna()) | set(kernel["device_slug"].dropna()))
    if len(devs) < 2:
        return None
    decode["tokens_per_tbps"] = decode["output_tokens_per_s"] / decode["peak_tbps"]
    if len(kernel):
        frac = kernel["frac_peak_bw"] if "frac_peak_bw" in kernel else pd.Series(float("nan"), index=kernel.index)
        kernel["frac_peak"] = frac.fillna(kernel["bandwidth_gbps"] / (kernel["peak_tbps"] * 1000))
        kernel["kernel batch"] = (kernel["kernel_batch"].map(lambda b: "-" if pd.isna(b) else f"{b:g}")
                                  if "kernel_batch" in kernel else "-")
    panels = []  # (frame, x, y, x label, y label, style)
    if len(decode):
        style = "mode" if (decode["mode"] != "eager").any() else "impl"
        panels += [(decode, "batch", "output_tokens_per_s", "batch", "output tokens/s", style),
                   (decode, "batch", "tokens_per_tbps", "batch", "output tokens/s per TB/s of peak", style)]
    if len(kernel):
        panels += [(kernel, "context_len", "bandwidth_gbps", "context length (tokens)", "kernel bandwidth (GB/s)", "kernel batch"),
                   (kernel, "context_len", "frac_peak", "context length (tokens)", "kernel fraction of peak bandwidth", "kernel batch")]
    fig, axes = grid(len(panels) * len(devs), ncols_max=len(devs), size=(4.6, 3.4), sharey="row")
    impls = sorted(set(decode["impl"]) | set(kernel["impl"]))
    for r, (frame, x, y, xlabel, ylabel, style) in enumerate(panels):
        for c, dev in enumerate(devs):
            ax = axes[r * len(devs) + c]
            sub = frame[(frame["device_slug"] == dev) & frame[y].notna()]
            if sub.empty:
                ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="0.5")
            else:
                sns.lineplot(data=sub, x=x, y=y, hue="impl", hue_order=[i for i in impls if i in set(sub["impl"])],
                             style=style, style_order=MODES if style == "mode" else None, palette=palette,
                             markers=True, **BARS, ax=ax,
                             legend=c == len(devs) - 1)
                count_axis(ax, sub[x])
            peak = frame.loc[frame["device_slug"] == dev, "peak_tbps"].dropna()
            ax.set_title(f"{dev}" + (f" ({peak.iloc[0]:g} TB/s peak)" if len(peak) else " (peak unknown)"))
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel if c == 0 else "")
            legend_outside(ax, None)
        # the row shares its y axis: from 0 to the highest value any device reached (set once, after all are drawn)
        top = frame[y].max()
        if pd.notna(top) and top > 0:
            axes[r * len(devs)].set_ylim(0, 1.08 * top)
    fig.suptitle("Across GPUs: raw and normalised by peak memory bandwidth")
    return fig
