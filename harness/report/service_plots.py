"""Service under load: normalized latency and goodput vs request rate, KV memory over time, max rate.

Decode rows whose requests arrived over time (``arrival`` other than ``burst``) carry the service
columns; ``scenario=max_rate`` rows carry the largest rate that passed the SLO; a run's ``steps``
table traces its KV memory step by step.
"""

from __future__ import annotations

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from harness.report.collect import ok_rows, with_mode
from harness.report.figures import MAX_FACETS, devices, drop_legend, facet_labels, grid, legend_outside, wrap
from harness.report.speed_plots import BARS

# Panels per model, workload and device (as the paper's Figure 12), split further by what else varies.
FACETS = ["model", "workload", "dtype", "batch", "arrival", "clock", "gpu", "mode", "device_slug"]
ALWAYS = ("model", "workload", "device_slug")
# Impls are compared at one setting: the max-rate ratio is taken among rows equal in all of these.
RATE_GROUP = ["device_slug", "model", "workload", "dtype", "batch", "max_seq_len", "arrival", "slo", "clock", "gpu",
              "mode"]


def service_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """Ok rows measured under an arrival process at an offered rate (burst rows have none): decode
    runs on the wall clock and capacity runs on the simulated one (``clock``, ``gpu``)."""
    df = with_mode(pd.concat([ok_rows(rows, "decode"), ok_rows(rows, "capacity")]))
    if "request_rate" not in df:
        return df.iloc[0:0]
    df = df.dropna(subset=["request_rate"])
    if "arrival" in df:
        df = df[df["arrival"].astype(str) != "burst"]
    return df


def _vs_rate(rows: pd.DataFrame, y: str, ylabel: str, palette: dict, log: bool = False) -> tuple[Figure, list] | None:
    """One panel per setting: ``y`` against the offered rate, one line per impl."""
    df = service_rows(rows)
    if y not in df:
        return None
    df = df.dropna(subset=[y])
    if df.empty:
        return None
    df["facet"] = facet_labels(df, [c for c in FACETS if c in df], always=ALWAYS)
    facets = sorted(df["facet"].unique())[:MAX_FACETS]
    fig, axes = grid(len(facets), size=(5.4, 4.0))
    for i, (ax, facet) in enumerate(zip(axes, facets)):
        sub = df[df["facet"] == facet]
        sns.lineplot(data=sub, x="request_rate", y=y, hue="impl", style="impl", markers=True, markersize=8,
                     palette=palette, hue_order=sorted(sub["impl"].unique()), **BARS, ax=ax)
        ax.set_title(wrap(facet))
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(ylabel)
        ax.set_xlim(left=0)
        if log:  # past its knee one impl's latency is 10-100x the others': a linear axis flattens them
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        legend_outside(ax, "impl") if i == len(facets) - 1 else drop_legend(ax)
    return fig, axes


def normalized_latency(rows: pd.DataFrame, palette: dict) -> Figure | None:
    """Mean over requests of end-to-end latency / output tokens, vs offered rate (PagedAttention Fig. 12)."""
    drawn = _vs_rate(rows, "normalized_latency_s", "normalized latency (s/token, log scale)", palette, log=True)
    if drawn is None:
        return None
    fig, _ = drawn
    fig.suptitle("Normalized latency vs request rate\n(cf. PagedAttention Fig. 12; bars: min-max over runs)")
    return fig


def goodput(rows: pd.DataFrame, palette: dict) -> Figure | None:
    """Requests per second that met every SLO, vs offered rate; the offered rate itself dashed."""
    drawn = _vs_rate(rows, "goodput_rps", "goodput (req/s meeting the SLO)", palette)
    if drawn is None:
        return None
    fig, axes = drawn
    for ax in axes:
        ax.axline((0, 0), slope=1, color="0.55", ls="--", lw=1, zorder=0)
    fig.suptitle("Goodput vs request rate\n(dashed: goodput = offered rate; bars: min-max over runs)")
    return fig


def _byte_unit(top: float) -> tuple[str, float]:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if top >= scale:
            return unit, scale
    return "bytes", 1.0


def chosen_runs(steps: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """Per setting (model, workload, device) and impl, the one decode run whose steps are drawn:
    the highest offered rate (burst last), then the first run folder."""
    if steps.empty or not {"impl", "t_s", "kv_used_bytes", "kv_reserved_bytes"} <= set(steps.columns):
        return pd.DataFrame()
    decode = ok_rows(rows, "decode").drop_duplicates(["run_dir", "impl"])
    have = steps[["run_dir", "impl"]].drop_duplicates()
    runs = decode.merge(have, on=["run_dir", "impl"])
    if runs.empty:
        return runs
    rate = runs["request_rate"] if "request_rate" in runs else pd.Series(float("nan"), index=runs.index)
    runs = runs.assign(rate=rate.fillna(-1.0)).sort_values(["rate", "run_dir"], ascending=[False, True])
    keys = [c for c in ALWAYS if c in runs]
    return runs.drop_duplicates(keys + ["impl"]).sort_values(keys + ["impl"]).reset_index(drop=True)


def _one_run(steps: pd.DataFrame, run_dir: str, impl: str) -> pd.DataFrame:
    """A run's steps for one impl, in order; if it holds several repeats, the first (time restarts)."""
    sub = steps[(steps["run_dir"] == run_dir) & (steps["impl"] == impl)]
    return sub[(sub["t_s"].diff() < 0).cumsum() == 0]


def kv_over_time(steps: pd.DataFrame, rows: pd.DataFrame, palette: dict) -> Figure | None:
    """KV memory reserved (dashed) and holding token states (solid) at every step, one run per impl."""
    runs = chosen_runs(steps, rows)
    if runs.empty:
        return None
    runs["facet"] = facet_labels(runs, list(ALWAYS), always=ALWAYS)
    facets = sorted(runs["facet"].unique())[:MAX_FACETS]
    top = steps[["kv_used_bytes", "kv_reserved_bytes"]].max().max()
    unit, scale = _byte_unit(top if pd.notna(top) else 0)
    fig, axes = grid(len(facets), ncols_max=2, size=(6.4, 4.0))
    for ax, facet in zip(axes, facets):
        handles = []
        for run in runs[runs["facet"] == facet].itertuples():
            sub = _one_run(steps, run.run_dir, run.impl)
            colour = palette.get(run.impl)
            ax.plot(sub["t_s"], sub["kv_reserved_bytes"] / scale, color=colour, ls="--", lw=1.3, drawstyle="steps-post")
            ax.plot(sub["t_s"], sub["kv_used_bytes"] / scale, color=colour, ls="-", lw=1.6, drawstyle="steps-post")
            rate = "burst" if run.rate < 0 else f"{run.rate:g} req/s"
            handles.append(Line2D([], [], color=colour, lw=2, label=f"{run.impl} ({rate})"))
        budget = runs.loc[runs["facet"] == facet, "budget_kv_bytes"].dropna() if "budget_kv_bytes" in runs else []
        if len(budget) and budget.nunique() == 1:
            ax.axhline(budget.iloc[0] / scale, color="black", ls=":", lw=1.2)
            handles.append(Line2D([], [], color="black", ls=":", label="KV budget"))
        handles += [Line2D([], [], color="0.3", ls="--", label="reserved"),
                    Line2D([], [], color="0.3", ls="-", label="holding token states")]
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False, fontsize=8.5)
        ax.set_title(wrap(facet))
        ax.set_xlabel("time since the run started (s)")
        ax.set_ylabel(f"KV cache ({unit})")
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
    fig.suptitle(f"KV memory over time, one run per impl\n(each impl's highest offered rate, on {devices(runs)})")
    return fig


def max_rate_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per setting and impl: the largest rate that passed the SLO (median over runs) and its ratio to contiguous."""
    df = with_mode(ok_rows(rows, "max_rate"))
    if df.empty or "max_rate_rps" not in df:
        return pd.DataFrame()
    df = df.dropna(subset=["max_rate_rps"])
    if df.empty:
        return df
    keys = [c for c in RATE_GROUP if c in df]
    probes = df["probes"] if "probes" in df else pd.Series(float("nan"), index=df.index)
    agg = (df.assign(probes=probes).groupby(keys + ["impl"], dropna=False)
           .agg(max_rate_rps=("max_rate_rps", "median"), probes=("probes", "sum"), runs=("run_dir", "nunique"))
           .reset_index())
    contiguous = agg.loc[agg["impl"] == "contiguous", keys + ["max_rate_rps"]]
    agg = agg.merge(contiguous.rename(columns={"max_rate_rps": "contiguous_rps"}), on=keys, how="left")
    agg["ratio"] = agg["max_rate_rps"] / agg["contiguous_rps"].where(agg["contiguous_rps"] > 0)
    return agg.sort_values(keys + ["impl"]).reset_index(drop=True)


def service_table(rows: pd.DataFrame) -> pd.DataFrame:
    """The service rows, ordered for reading: setting, impl, then rate."""
    df = service_rows(rows)
    order = [c for c in ("device_slug", "model", "workload", "arrival", "clock", "gpu", "impl", "request_rate", "run_dir")
             if c in df]
    return df.sort_values(order)
