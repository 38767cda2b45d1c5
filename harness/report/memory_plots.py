"""Memory figures: KV bytes vs concurrency, the waste breakdown, and max concurrency."""

from __future__ import annotations

import numbers

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from kvbench.harness.report.selection import ANY_DEVICE, ok_rows, unique_points
from kvbench.harness.report.figures import DEFAULT_BLOCK_SIZE, GB, MAX_FACETS, devices, facet_labels, fmt_bytes, grid, show, wrap
from kvbench.harness.report.palette import impl_order, impl_style

VARIANTS = {"contiguous": "contiguous (max_seq_len per request)", "paged": "paged",
            "paged_shared": "paged + prefix/fork sharing"}
# Each variant in the colour and marker of the impl that stores it that way; sharing is paged, dashed and hollow.
VARIANT_STYLE = {"contiguous": {"color": impl_style("contiguous").colour, "marker": impl_style("contiguous").marker},
                 "paged": {"color": impl_style("paged").colour, "marker": impl_style("paged").marker},
                 "paged_shared": {"color": impl_style("paged").colour, "marker": impl_style("paged").marker,
                                  "ls": (0, (5, 2)), "markerfacecolor": "white"}}
SHORT = {"paged_shared": "paged + sharing"}  # a variant's name in a panel's note
POINT_INPUTS = ["model", "workload", "dtype", "max_seq_len", "block_size", "n", "shared_prefix_len", "budget_kv_bytes"]
# The seeds' experiment (README, docs/figures.md): Llama-2-7B serving 100 requests of 100 + 400 tokens at once; its panel comes first.
SEEDS_EXPERIMENT = {"model": "llama-2-7b", "prompt_len": 100.0, "output_len": 400.0, "batch": 100.0}
MORE_FACETS = 12  # the second figure's panels at most; beyond them the settings are named in REPORT.md


def _inputs_title(p: pd.Series) -> str:
    """The inputs behind a points facet, named (the seeds' figure must say what it assumed)."""
    line1 = f"{p['model']} · {p['workload']} · {p.get('dtype', '')}"
    parts = [show(c, p.get(c)) for c in ("max_seq_len", "block_size") if c in p]
    if not pd.isna(p.get("prompt_len", np.nan)):
        parts.append(f"prompt {p['prompt_len']:.4g} + output {p['output_len']:.4g} tokens")
    if p.get("n", 1) and p.get("n", 1) > 1:
        parts.append(show("n", p["n"]))
    if p.get("shared_prefix_len", 0) and p.get("shared_prefix_len", 0) > 0:
        parts.append(show("shared_prefix_len", p["shared_prefix_len"]))
    title = line1 + "\n" + wrap(" · ".join(parts), 50)
    if _is_seeds_experiment(p):
        title += f"\n(the seeds' experiment: {SEEDS_EXPERIMENT['batch']:g} requests at once)"
    return title


def _is_seeds_experiment(p: pd.Series) -> bool:
    return all(k in p and p[k] == v for k, v in SEEDS_EXPERIMENT.items())


def _number_key(v) -> tuple:
    """Numbers by value (block 2 before block 16), a missing one last; text as text."""
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return (2, 0.0, "")
    return (0, float(v), "") if isinstance(v, numbers.Number) else (1, 0.0, str(v))


def _off_default(p: pd.Series) -> bool:
    """A block-size sweep's panel: a block size other than the default."""
    return not pd.isna(p.get("block_size")) and p.get("block_size") != DEFAULT_BLOCK_SIZE


def _importance(p: pd.Series) -> tuple:
    """How soon a panel is shown: the seeds' experiment, then panels at the default block size (the seeds'
    model first), then the block-size sweep; within each, by model and workload, then every input by number."""
    return (not _is_seeds_experiment(p), _off_default(p), p.get("model") != SEEDS_EXPERIMENT["model"],
            *(_number_key(p.get(c)) for c in POINT_INPUTS))


def panel_label(p: pd.Series) -> str:
    """One line naming a panel's setting, for a reader (budgets in GB, block sizes as numbers)."""
    unset = {"n": 1, "shared_prefix_len": 0}  # no parallel samples, no shared prefix: not worth a word
    return " · ".join(show(c, p[c]) for c in POINT_INPUTS if c in p and not pd.isna(p[c]) and unset.get(c) != p[c])


def memory_panels(points: pd.DataFrame, rows: pd.DataFrame) -> tuple[list[pd.DataFrame], list[pd.DataFrame], list[str]]:
    """The points of each setting, split in the main figure's panels, the second figure's, and the labels of
    any left over; each list most important first (``_importance``)."""
    pts = unique_points(points)
    if pts.empty or not {"concurrency", "variant", "kv_bytes_reserved"} <= set(pts.columns):
        return [], [], []
    runs = [c for c in ("prompt_len", "output_len", "batch") if c in rows.columns]
    if runs and "run_dir" in rows:  # the lengths and the batch live in the rows, not the points
        pts = pts.join(rows.drop_duplicates("run_dir").set_index("run_dir")[runs], on="run_dir")
    keys = [c for c in POINT_INPUTS if c in pts.columns]
    pts["GB"] = pts["kv_bytes_reserved"] / GB
    panels = sorted((sub for _, sub in pts.groupby(keys, dropna=False, sort=False)),
                    key=lambda sub: _importance(sub.iloc[0]))
    # a setting at one concurrency is a dot, not a curve: it is a row of the section's table instead
    single = [sub for sub in panels if sub["concurrency"].nunique() <= 1]
    panels = [sub for sub in panels if sub["concurrency"].nunique() > 1]
    singles = [f"{panel_label(sub.iloc[0])} (one concurrency only: its row is in the table)" for sub in single]
    # the sweep's panels stay together in the second figure, unless there is nothing else to show
    at_default = [sub for sub in panels if not _off_default(sub.iloc[0])] or panels
    main = at_default[:MAX_FACETS]
    rest = [sub for sub in panels if not any(sub is m for m in main)]
    return main, rest[:MORE_FACETS], singles + [f"{panel_label(sub.iloc[0])} (past the panels shown)"
                                                for sub in rest[MORE_FACETS:]]


def _memory_figure(panels: list[pd.DataFrame], title: str, ncols_max: int) -> Figure:
    """Plot 1's panels: KV GB reserved vs concurrent requests per variant, token states and the budget."""
    variants = {v for sub in panels for v in sub["variant"]}
    order = [v for v in VARIANTS if v in variants] + sorted(variants - set(VARIANTS))
    fig, axes = grid(len(panels), ncols_max=ncols_max, size=(5.6, 4.2))
    budget_drawn = False
    for ax, sub in zip(axes, panels):
        for v in order:
            line = sub[sub["variant"] == v].groupby("concurrency")["GB"].mean()
            style = {"marker": "o", "color": "0.3", **VARIANT_STYLE.get(v, {})}
            ax.plot(line.index, line.values, markersize=6, lw=1.6, label=VARIANTS.get(v, v), **style)
        tokens = sub.groupby("concurrency")["kv_bytes_used"].min() / GB
        ax.plot(tokens.index, tokens.values, color="0.55", lw=1, ls=(0, (1, 1)), label="_tokens")
        budget = sub["budget_kv_bytes"].dropna() if "budget_kv_bytes" in sub else pd.Series(dtype=float)
        if len(budget):
            budget_drawn = True
            ax.axhline(budget.iloc[0] / GB, color="black", ls="--", lw=1.2, label="_budget")
            ax.annotate(f"KV budget {fmt_bytes(budget.iloc[0])}", (1, budget.iloc[0] / GB), xycoords=("axes fraction", "data"),
                        xytext=(-4, 4), textcoords="offset points", ha="right", va="bottom", fontsize=8.5)
            _annotate_saving(ax, sub, budget.iloc[0])
        title_text = _inputs_title(sub.iloc[0])
        wide = sub.pivot_table(index="concurrency", columns="variant", values="kv_bytes_reserved", aggfunc="first")
        if {"paged", "paged_shared"} <= set(wide.columns) and (wide["paged"] == wide["paged_shared"]).all():
            title_text += "\n(nothing shared: paged + sharing = paged)"
        ax.set_title(title_text)
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel("KV cache memory reserved (GB)")
        ax.set_xlim(left=0)
        _clip_y(ax, sub, budget.max() / GB if len(budget) else None)
    handles = [Line2D([], [], markersize=6, lw=1.6, label=VARIANTS.get(v, v), **{"marker": "o", "color": "0.3",
                                                                                 **VARIANT_STYLE.get(v, {})})
               for v in order]
    handles.append(Line2D([], [], color="0.55", lw=1, ls=(0, (1, 1)), label="token states only"))
    if budget_drawn:
        handles.append(Line2D([], [], color="black", ls="--", lw=1.2, label="KV budget"))
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), frameon=False, fontsize=9)
    fig.suptitle(title)
    return fig


def memory_vs_concurrency(points: pd.DataFrame, rows: pd.DataFrame) -> tuple[Figure | None, list[str]]:
    """Plot 1: KV bytes reserved to serve N concurrent requests, per variant, with the budget: the most
    important settings (``memory_panels``); and the settings it leaves out, each with why."""
    main, more, left = memory_panels(points, rows)
    if not main:
        return None, left
    title = f"KV memory needed vs concurrent requests\n(capacity simulation on {devices(pd.concat(main))})"
    return _memory_figure(main, title, 3), [f"{panel_label(sub.iloc[0])} (past the panels shown)" for sub in more] + left


def memory_vs_concurrency_more(points: pd.DataFrame, rows: pd.DataFrame) -> tuple[Figure | None, list[str]]:
    """Plot 1's other settings (the block-size sweep, ...), in a figure of their own; and the labels of
    any beyond ``MORE_FACETS`` panels, which neither figure shows."""
    _, more, left = memory_panels(points, rows)
    if not more:
        return None, left
    title = (f"KV memory needed vs concurrent requests: the other settings\n"
             f"(capacity simulation on {devices(pd.concat(more))})")
    return _memory_figure(more, title, 4), left


def _clip_y(ax, sub: pd.DataFrame, budget_gb: float | None) -> None:
    """Up to 2.5x the budget at most, so the budget line and the paged curves stay readable;
    what runs off the top is named in the corner."""
    top = sub["GB"].max()
    cap = 2.5 * budget_gb if budget_gb else top
    if top <= 1.1 * cap:
        ax.set_ylim(0, 1.12 * max(top, budget_gb or 0))
        return
    ax.set_ylim(0, cap)
    off = sub[sub["GB"] > cap].sort_values("concurrency").groupby("variant").last()
    note = "\n".join(f"{SHORT.get(v, v)} reaches {r.GB:.0f} GB at {r.concurrency:g}" for v, r in off.iterrows())
    ax.text(0.98, 0.97, f"off scale: {note}", transform=ax.transAxes, ha="right", va="top", fontsize=8, color="0.2",
            bbox={"facecolor": "white", "edgecolor": "0.8", "boxstyle": "round,pad=0.3"})


def _annotate_saving(ax, sub: pd.DataFrame, budget: float) -> None:
    """What paging saves at the most requests the contiguous cache serves within the budget."""
    wide = sub.pivot_table(index="concurrency", columns="variant", values="kv_bytes_reserved", aggfunc="first")
    if not {"contiguous", "paged"} <= set(wide.columns):
        return
    fits = wide.index[wide["contiguous"] <= budget]
    if not len(fits):
        return
    n = fits.max()
    top, bottom = wide.at[n, "contiguous"] / GB, wide.at[n, "paged"] / GB
    ax.annotate("", (n, bottom), (n, top), arrowprops={"arrowstyle": "<->", "color": "0.3", "lw": 1})
    right = n < 0.6 * sub["concurrency"].max()  # the label beside the arrow, on the side with room
    ax.annotate(f"paging saves\n{top - bottom:.1f} GB at {n:g}", (n, (top + bottom) / 2), xytext=(6 if right else -6, 0),
                textcoords="offset points", ha="left" if right else "right", va="center", fontsize=8.5, color="0.2",
                # a white ground: near few requests the label sits over the paged curves
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1})


EXTERNAL = "kv_external_fragmentation_bytes"  # free, but in holes too small for the next request
BREAKDOWN = [("kv_bytes_used", "token states", "#4c9a2a"),
             ("kv_fragmentation_bytes", "internal fragmentation", "#f0a30a"),
             ("kv_reservation_waste_bytes", "reservation waste", "#c0392b"),
             (EXTERNAL, "external fragmentation", "#7d3c98")]
GROUP_COLS = ["scenario", "model", "workload", "batch", "device_slug"]


def breakdown_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (scenario, model, workload, batch, device, impl): the snapshot's parts, averaged over runs."""
    decode = ok_rows(rows, "decode")
    if len(decode) and "batch" in decode:  # one bar per decode setting: its largest batch, where memory matters
        largest = decode.groupby(["model", "workload", "device_slug"], dropna=False)["batch"].transform("max")
        decode = decode[decode["batch"] == largest]
    capacity = ok_rows(rows, "capacity")
    if len(capacity) and "device_slug" in capacity:  # KV accounting is no device's: one bar per setting
        capacity = capacity.assign(device_slug=ANY_DEVICE)
    df = pd.concat([capacity, decode])
    cols = [c for c, _, _ in BREAKDOWN]
    if not df.empty:
        # Rows from before the column existed are of the max and paged caches, which have none.
        df[EXTERNAL] = df[EXTERNAL].fillna(0) if EXTERNAL in df.columns else 0
    if df.empty or not set(cols) <= set(df.columns):
        return pd.DataFrame()
    df = df.dropna(subset=cols)  # a bar needs all its parts
    if df.empty:
        return df
    keys = [c for c in GROUP_COLS if c in df.columns] + ["impl"]
    agg = df.groupby(keys, dropna=False)[cols + ["kv_bytes_reserved"]].mean().reset_index()
    agg["held_bytes"] = agg[cols].sum(axis=1)
    agg["used_pct"] = 100 * agg["kv_bytes_used"] / agg["held_bytes"]
    return agg.sort_values(keys).reset_index(drop=True)


# The breakdown's height in bar rows above which its groups go into two columns (an image readable on one screen:
# about 2,000 px at the report's 130 dpi).
BREAKDOWN_COLUMN_ROWS = 26


def _breakdown_columns(agg: pd.DataFrame) -> list[list[str]]:
    """The groups in drawing order, in one column, or two of about equal height when one would be too tall."""
    heights = {g: 0.75 + len(sub) + 0.4 for g, sub in agg.groupby("group", sort=False)}
    total = sum(heights.values())
    if total <= BREAKDOWN_COLUMN_ROWS:
        return [list(heights)]
    first, acc = [], 0.0
    for group, h in heights.items():
        if acc + h / 2 > total / 2 and first:
            break
        first.append(group)
        acc += h
    return [first, [g for g in heights if g not in first]]


def _draw_breakdown(ax, agg: pd.DataFrame, groups: list[str], parts: list) -> float:
    """One column of the breakdown: each group's header, then a bar per impl; returns the column's height."""
    ypos, ticks, labels, headers, y = [], [], [], [], 0.0
    for group in groups:
        sub = agg[agg["group"] == group]
        headers.append((y, group))
        y += 0.75
        for idx in sub.index:
            ypos.append((idx, y))
            ticks.append(y)
            labels.append(agg.at[idx, "impl"])
            y += 1
        y += 0.4
    sel, pos = [i for i, _ in ypos], [p for _, p in ypos]
    cols = [c for c, _, _ in parts]
    shares = agg.loc[sel, cols].div(agg.loc[sel, "held_bytes"], axis=0) * 100
    left = np.zeros(len(sel))
    for col, name, colour in parts:
        ax.barh(pos, shares[col].to_numpy(), left=left, height=0.8, color=colour, label=name)
        left += shares[col].to_numpy()
    for idx, p in ypos:
        pct = agg.at[idx, "used_pct"]
        inside = pct >= 25  # room for the label inside the green part
        ax.text(pct / 2 if inside else pct + 1, p, f"{pct:.1f}% token states", va="center",
                ha="center" if inside else "left", color="white" if inside else "black",
                fontweight="bold", fontsize=9)
        ax.text(101, p, f"of {fmt_bytes(agg.at[idx, 'held_bytes'])}", va="center", ha="left", fontsize=8.5)
    for hy, text in headers:
        ax.text(0, hy + 0.1, text, va="center", ha="left", fontsize=9.5, fontweight="bold")
    ax.set_yticks(ticks, labels)
    ax.set_xlim(0, 100)
    ax.grid(axis="y", visible=False)
    return y


def kv_breakdown(rows: pd.DataFrame) -> Figure | None:
    """Plot 2: like the PagedAttention paper's Figure 2, the share of held KV memory that holds tokens; its groups
    in two columns when one would be taller than a screen."""
    agg = breakdown_table(rows)
    if agg.empty:
        return None
    agg["group"] = facet_labels(agg, [c for c in GROUP_COLS if c in agg.columns], always=("scenario", "model"))
    columns = _breakdown_columns(agg)
    # External fragmentation only where some impl has any (variable-size reservations), so a
    # figure of max and paged caches alone stays as it was.
    stranded = bool(agg[EXTERNAL].any())
    parts = [part for part in BREAKDOWN if part[0] != EXTERNAL or stranded]
    rows_high = max(0.75 * sum(1 for g in col) + sum((agg["group"] == g).sum() + 0.4 for g in col) for col in columns)
    fig, axes = grid(len(columns), size=(9.0, 1.3 + 0.5 * rows_high))
    heights = [_draw_breakdown(ax, agg, col, parts) for ax, col in zip(axes, columns)]
    for ax in axes:
        ax.set_ylim(max(heights) - 0.2, -0.5)  # the columns' bars the same height
        ax.set_xlabel("share of the KV memory held" + (" or stranded in holes" if stranded else "")
                      + " when token states peaked (%)")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=len(parts), frameon=False)
    fig.suptitle(f"KV memory breakdown per impl ({devices(agg)})\n"
                 "cf. PagedAttention Fig. 2: prior systems 20.4-38.2% token states, vLLM 96.3%"
                 + ("\n(decode: the largest batch of each model and device)" if (agg["scenario"] == "decode").any()
                    else ""))
    return fig


def concurrency_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Measured and predicted max concurrency: the search's rows if any, else the capacity rows."""
    src = ok_rows(rows, "max_concurrency")
    if src.empty:
        src = ok_rows(rows, "capacity")
    if src.empty or not {"max_concurrency", "max_concurrency_analytic"} <= set(src.columns):
        return pd.DataFrame()
    src = src.dropna(subset=["max_concurrency", "max_concurrency_analytic"], how="all")
    if src.empty:
        return src
    keys = [c for c in ("scenario", "model", "workload", "max_seq_len", "budget_kv_bytes", "device_slug", "impl")
            if c in src.columns]
    grouped = src.groupby(keys, dropna=False)
    vals = grouped[["max_concurrency", "max_concurrency_analytic", "batch"]].mean()
    # runs of one setting that disagree (e.g. different code versions) are shown as a range, not hidden
    for col in ("max_concurrency", "max_concurrency_analytic"):
        lo, hi = grouped[col].min(), grouped[col].max()
        vals[f"{col}_label"] = [_range(a, b) for a, b in zip(lo, hi)]
    vals = vals.reset_index()
    # The capacity scenario stops at its batch (max_num_seqs): a measured value there is a lower bound.
    vals["capped"] = (vals["scenario"] == "capacity") & (vals["max_concurrency"] >= vals["batch"])
    return vals


def _range(lo: float, hi: float) -> str:
    if pd.isna(lo):
        return ""
    return f"{lo:.0f}" if lo == hi else f"{lo:.0f}–{hi:.0f}"


def max_concurrency(rows: pd.DataFrame) -> Figure | None:
    """Plot 3: max concurrency per impl and model, measured next to predicted (vLLM's formula)."""
    vals = concurrency_table(rows)
    if vals.empty:
        return None
    facet_cols = [c for c in ("model", "workload", "max_seq_len", "budget_kv_bytes", "device_slug") if c in vals]
    vals["facet"] = facet_labels(vals, facet_cols, always=("model",))
    facets = sorted(vals["facet"].unique())[:MAX_FACETS]
    long = vals.melt(id_vars=["facet", "impl", "capped", "batch"],
                     value_vars=["max_concurrency", "max_concurrency_analytic"], var_name="kind", value_name="requests")
    long["label"] = vals.melt(id_vars=["facet", "impl"], value_vars=["max_concurrency_label",
                                                                     "max_concurrency_analytic_label"])["value"]
    long["kind"] = long["kind"].map({"max_concurrency": "measured (no preemption)",
                                     "max_concurrency_analytic": "predicted (KV tokens / request)"})
    kinds = ["measured (no preemption)", "predicted (KV tokens / request)"]
    fig, axes = grid(len(facets), ncols_max=3, size=(5.0, 4.0))
    width = 0.4
    for ax, facet in zip(axes, facets):
        sub = long[long["facet"] == facet]
        order = impl_order(sub["impl"].unique())
        # each impl in its own colour: measured filled, predicted hatched in the same colour beside it
        for k, kind in enumerate(kinds):
            part = sub[sub["kind"] == kind].set_index("impl").reindex(order)
            for j, (impl, r) in enumerate(part.iterrows()):
                if pd.isna(r["requests"]):
                    continue
                colour = impl_style(impl).colour
                bars = ax.bar(j + (k - 0.5) * width, r["requests"], width * 0.95, color=colour if k == 0 else "white",
                              edgecolor=colour, hatch=None if k == 0 else "///", lw=1.2,
                              label=impl if k == 0 else "_predicted")
                mark = "≥" if k == 0 and bool(r["capped"]) else ""
                ax.bar_label(bars, labels=[mark + str(r["label"])], fontsize=8.5, padding=2)
        ax.set_xticks(range(len(order)), order)
        ax.set_title(wrap(facet))
        ax.set_xlabel("")
        ax.set_ylabel("concurrent sequences")
        ax.margins(y=0.12)
        ax.grid(axis="x", visible=False)
    fig.legend(handles=[Patch(facecolor="0.45", edgecolor="0.45", label=kinds[0]),
                        Patch(facecolor="white", edgecolor="0.45", hatch="///", label=kinds[1])],
               loc="outside lower center", ncol=2, frameon=False, fontsize=9)
    capped = vals[vals["capped"]]
    note = (f"\n≥: the run's batch limit (B={', '.join(f'{b:g}' for b in sorted(capped['batch'].unique()))}) was reached first"
            if len(capped) else "")
    src = "max_concurrency search" if (vals["scenario"] == "max_concurrency").any() else "capacity simulation"
    fig.suptitle(f"Max concurrency per impl: measured vs predicted\n({src} on {devices(vals)}){note}")
    return fig
