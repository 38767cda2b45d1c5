"""Speed figures: decode throughput, kernel latency and bandwidth, and the cross-device comparison.

Every impl keeps its colour and marker (harness.report.palette); line dashes tell apart the second
variable of a figure (CUDA graphs, a kernel's layout and block size, the kernel's batch), and each
figure has one legend naming every impl drawn in any of its panels.
"""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from kvbench.harness.report.selection import MODES, burst, ok_rows, with_mode
from kvbench.harness.report.figures import (DEFAULT_BLOCK_SIZE, MAX_FACETS, count_axis, facet_labels, grid, log_axis,
                                            single_point_facets, wrap)
from kvbench.harness.report.hardware import with_peak
from kvbench.harness.report.palette import dash_entries, dash_handle, figure_legend, impl_lines

PEAK_LINE = {"color": "black", "ls": "--", "lw": 1.2}
COPY_LINE = {"color": "0.45", "ls": ":", "lw": 1.5}


def _modes(df: pd.DataFrame) -> tuple[str | None, list[str]]:
    """Dash decode lines by mode only when some rows replayed CUDA graphs (eager stays solid either way)."""
    present = [m for m in MODES if m in set(df["mode"])]
    return ("mode", present) if present != ["eager"] else (None, [])


def decode_throughput(rows: pd.DataFrame, palette: dict, left_out: list[str] | None = None) -> Figure | None:
    """Plot 4: output tokens/s vs batch, one line per impl (dashed: with CUDA graphs, when both ran).

    A setting measured at one batch only is a table row, not a panel of dots; it and the settings past
    ``MAX_FACETS`` are added to ``left_out``, each with why, for REPORT.md to name."""
    left_out = [] if left_out is None else left_out
    df = with_mode(burst(ok_rows(rows, "decode")).dropna(subset=["output_tokens_per_s", "batch"]))
    if df.empty:
        return None
    df["facet"] = facet_labels(df, ["model", "workload", "dtype", "device_slug"],
                               always=("model", "workload", "device_slug"))
    single = single_point_facets(df, "facet", "batch")
    left_out += [f"{f} (one batch only: its rows are in the table)" for f in single]
    facets = sorted(set(df["facet"]) - set(single))
    left_out += [f"{f} (past {MAX_FACETS} panels: its rows are in the table)" for f in facets[MAX_FACETS:]]
    facets = facets[:MAX_FACETS]
    if not facets:
        return None
    dash_by, modes = _modes(df)
    fig, axes = grid(len(facets), size=(5.4, 4.0))
    drawn: set[str] = set()
    for ax, facet in zip(axes, facets):
        sub = df[df["facet"] == facet]
        drawn |= set(impl_lines(ax, sub, "batch", "output_tokens_per_s", palette, dash_by, MODES))
        count_axis(ax, sub["batch"])
        ax.set_title(wrap(facet))
        ax.set_xlabel("batch (most sequences decoded at once)")
        ax.set_ylabel("output tokens/s")
        ax.set_ylim(bottom=0)
    figure_legend(fig, drawn, [("mode", dash_entries(modes, MODES))] if dash_by else [], palette)
    fig.suptitle("Decode throughput vs batch (bars: min-max over runs)")
    return fig


def _gbps(v: float) -> str:
    return f"{v:.0f}" if v >= 100 else f"{v:.3g}"


def _rooflines(ax, sub: pd.DataFrame) -> tuple[set[str], str]:
    """Horizontal lines at the peak (row, else datasheet) and the measured copy bandwidth; the kinds drawn,
    and their values for the panel's title (a label on the panel would sit on the lines that reach them)."""
    drawn, values = set(), []
    peak = sub["peak_bw_gbps"].dropna() if "peak_bw_gbps" in sub else pd.Series(dtype=float)
    label = "peak"
    if peak.empty:
        peak = with_peak(sub)["peak_tbps"].dropna() * 1000
        label = "datasheet peak"
    copy = sub["copy_bw_gbps"].dropna() if "copy_bw_gbps" in sub else pd.Series(dtype=float)
    for kind, found, line, name in (("peak", peak, PEAK_LINE, label), ("copy", copy, COPY_LINE, "measured copy")):
        if len(found):
            ax.axhline(found.median(), **line, label="_" + kind)
            values.append(f"{name} {_gbps(found.median())} GB/s")
            drawn.add(kind)
    return drawn, " · ".join(values)


OWN = f"own layout (paged: block {DEFAULT_BLOCK_SIZE})"  # what each impl reads when it serves: solid


def _variant(row: pd.Series) -> str:
    """The dashes of a kernel row: its layout and block size. Each impl's own layout (the contiguous impl's
    slab, a paged impl's block table at the default block size) is one solid line; a paged kernel reading
    an identity table (``layout=contiguous``) or another block size is dashed."""
    layout = row["layout"] if "layout" in row and isinstance(row["layout"], str) else None
    block = row.get("block_size")
    if row.get("impl") == "contiguous" or pd.isna(block):
        return OWN
    where = "own layout" if layout in (None, "paged") else "identity table"
    if where == "own layout" and block == DEFAULT_BLOCK_SIZE:
        return OWN
    return f"{where} · block {block:g}"


def _variant_key(v: str) -> tuple:
    """The own layout first, then the others by layout and block size as a number (16 before 128)."""
    where, _, block = v.partition(" · block ")
    return v != OWN, where, float(block) if block else -1.0


def _ms_or_us(values: pd.Series) -> tuple[str, float]:
    """Latency in µs, or in ms when even the fastest call takes a millisecond or more."""
    return ("ms", 1e3) if len(values) and values.min() >= 1e3 else ("µs", 1.0)


def kernel_latency_bandwidth(rows: pd.DataFrame, palette: dict, left_out: list[str] | None = None) -> Figure | None:
    """Plot 5: latency and achieved bandwidth vs context length (colour and marker: impl; dashes: layout and block
    size). A setting at one context length only, and those past ``MAX_FACETS``, go to ``left_out`` with why."""
    left_out = [] if left_out is None else left_out
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
    single = single_point_facets(df, "facet", "context_len")
    left_out += [f"{f} (one context length only: its rows are in the table)" for f in single]
    facets = [f for f in df.sort_values(order)["facet"].unique() if f not in single]
    left_out += [f"{f} (past {MAX_FACETS} panels: its rows are in the table)" for f in facets[MAX_FACETS:]]
    facets = facets[:MAX_FACETS]
    if not facets:
        return None
    fig, axes = grid(2 * len(facets), ncols_max=2, size=(5.4, 3.6))
    variants = sorted(df["variant"].unique(), key=_variant_key)
    drawn: set[str] = set()
    lines: set[str] = set()
    for r, facet in enumerate(facets):
        sub = df[df["facet"] == facet]
        lat, bw = axes[2 * r], axes[2 * r + 1]
        unit, scale = _ms_or_us(sub["latency_us_p50"].dropna())
        sub = sub.assign(latency=sub["latency_us_p50"] / scale)
        for ax, y, label in ((lat, "latency", f"latency p50 ({unit})"), (bw, "bandwidth_gbps", "achieved bandwidth (GB/s)")):
            drawn |= set(impl_lines(ax, sub, "context_len", y, palette, "variant", variants))
            count_axis(ax, sub["context_len"])
            ax.set_xlabel("context length (tokens)")
            ax.set_ylabel(label)
            ax.set_title(wrap(facet))
        lat_vals = sub["latency"].dropna()
        if len(lat_vals) and lat_vals.max() > 10 * lat_vals.min() > 0:
            log_axis(lat)
            lat.set_ylabel(f"latency p50 ({unit}, log scale)")
        kinds, values = _rooflines(bw, sub)
        lines |= kinds
        if values:
            bw.set_title(wrap(facet) + "\n" + values)
        bw.set_ylim(bottom=0)
    present = [v for v in variants if v in set(df.loc[df["facet"].isin(facets), "variant"])]
    reference = ([dash_handle("peak bandwidth", PEAK_LINE["ls"], PEAK_LINE["color"])] if "peak" in lines else []) + \
                ([dash_handle("measured copy bandwidth", COPY_LINE["ls"], COPY_LINE["color"])] if "copy" in lines else [])
    figure_legend(fig, drawn, [("kernel reads", dash_entries(present, variants)), ("reference", reference)], palette)
    fig.suptitle("Decode attention kernel vs context length (bars: min-max over runs)")
    return fig


def _native_layout(kernel: pd.DataFrame) -> pd.DataFrame:
    """The rows of each impl's own layout (``OWN``), one line per impl and batch, comparable across devices;
    a device without any keeps all its rows."""
    own = pd.Series([_variant(r) == OWN for _, r in kernel.iterrows()], index=kernel.index, dtype=bool)
    has_own = set(kernel.loc[own, "device_slug"])
    return kernel[own | ~kernel["device_slug"].isin(has_own)]


def gpu_comparison(rows: pd.DataFrame, palette: dict) -> Figure | None:
    """Plot 6 (2+ devices): key metrics with one column per device, raw and normalised by peak bandwidth.

    A panel without data is left out (a CPU has no peak bandwidth to normalise by). Raw panels each
    have their own y axis, so a CPU's figures stay readable beside a GPU's; a normalised row shares one."""
    decode = with_peak(with_mode(burst(ok_rows(rows, "decode")).dropna(subset=["output_tokens_per_s", "batch"])))
    kernel = ok_rows(rows, "kernel")
    if "bandwidth_gbps" in kernel:
        kernel = with_peak(_native_layout(kernel.dropna(subset=["bandwidth_gbps", "context_len"])))
    else:
        kernel = kernel.iloc[0:0]
    devs = sorted(set(decode["device_slug"].dropna()) | set(kernel["device_slug"].dropna()))
    if len(devs) < 2:
        return None
    decode["tokens_per_tbps"] = decode["output_tokens_per_s"] / decode["peak_tbps"]
    batches: list[float] = []
    if len(kernel):
        frac = kernel["frac_peak_bw"] if "frac_peak_bw" in kernel else pd.Series(float("nan"), index=kernel.index)
        kernel["pct_peak"] = 100 * frac.fillna(kernel["bandwidth_gbps"] / (kernel["peak_tbps"] * 1000))
        kernel["kernel batch"] = kernel["kernel_batch"] if "kernel_batch" in kernel else float("nan")
        batches = sorted(kernel["kernel batch"].dropna().unique())
    metrics = []  # (frame, x, y, x label, y label, dash_by, dash order, normalised)
    dash_by, modes = _modes(decode) if len(decode) else (None, [])
    if len(decode):
        metrics += [(decode, "batch", "output_tokens_per_s", "batch", "output tokens/s", dash_by, MODES, False),
                    (decode, "batch", "tokens_per_tbps", "batch", "output tokens/s per TB/s of peak", dash_by, MODES, True)]
    if len(kernel):
        metrics += [(kernel, "context_len", "bandwidth_gbps", "context length (tokens)", "kernel bandwidth (GB/s)",
                     "kernel batch", batches, False),
                    (kernel, "context_len", "pct_peak", "context length (tokens)", "kernel bandwidth (% of peak)",
                     "kernel batch", batches, True)]
    cells = [[frame[(frame["device_slug"] == dev) & frame[y].notna()] for dev in devs]
             for frame, _, y, *_ in metrics]
    keep = [r for r, row in enumerate(cells) if any(len(c) for c in row)]
    fig, axes = grid(len(keep) * len(devs), ncols_max=len(devs), size=(4.6, 3.4))
    drawn: set[str] = set()
    for i, r in enumerate(keep):
        frame, x, y, xlabel, ylabel, dash, order, normalised = metrics[r]
        row_axes = []
        for c, dev in enumerate(devs):
            ax, sub = axes[i * len(devs) + c], cells[r][c]
            if sub.empty:  # nothing measured here: no panel, not an empty one
                ax.remove()
                continue
            drawn |= set(impl_lines(ax, sub, x, y, palette, dash, order))
            count_axis(ax, sub[x])
            peak = frame.loc[frame["device_slug"] == dev, "peak_tbps"].dropna()
            models = ", ".join(sorted(sub["model"].dropna().astype(str).unique())) if "model" in sub else ""
            ax.set_title(f"{dev}" + (f" ({peak.iloc[0]:g} TB/s peak)" if len(peak) else " (peak unknown)")
                         + (f"\n{models}" if models and x == "batch" else ""))
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.set_ylim(bottom=0)
            row_axes.append(ax)
        if normalised:  # one scale for the row: from 0 to the highest value any device reached
            top = max(ax.get_ylim()[1] for ax in row_axes)
            for ax in row_axes:
                ax.set_ylim(0, top)
    sections = []
    if dash_by and any(metrics[r][0] is decode for r in keep):
        sections.append(("decode: mode", dash_entries(modes, MODES)))
    if batches and any(metrics[r][0] is kernel for r in keep):
        sections.append(("kernel: batch", dash_entries(batches, batches, lambda b: f"B={b:g}")))
    figure_legend(fig, drawn, sections, palette)
    title = "Across devices: raw, and normalised by peak memory bandwidth"
    if len(kernel):
        title += "\n(kernel: each impl's own layout, block 16)"
    fig.suptitle(title)
    return fig
