"""Service under load: normalized latency and goodput vs request rate, KV memory over time, max rate.

Decode rows whose requests arrived over time (``arrival`` other than ``burst``) carry the service
columns; ``scenario=max_rate`` rows carry the largest rate that passed the SLO; a run's ``steps``
table traces its KV memory step by step.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from kvbench.harness.report.selection import measured_as, ok_rows, with_mode
from kvbench.harness.report.figures import MAX_FACETS, devices, facet_labels, grid, log_axis, single_point_facets, wrap
from kvbench.harness.report.palette import colour_of, dash_handle, figure_legend, impl_lines, impl_style

# Panels per model, workload and device (as the paper's Figure 12), split further by what else varies.
FACETS = ["model", "workload", "dtype", "batch", "chunked_prefill", "arrival", "clock", "gpu", "mode", "device_slug"]
ALWAYS = ("model", "workload", "device_slug")
# Impls are compared at one setting: the max-rate ratio is taken among rows equal in all of these.
RATE_GROUP = ["device_slug", "model", "workload", "dtype", "batch", "max_seq_len", "arrival", "slo", "clock", "gpu",
              "mode"]


def service_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """Ok rows measured under an arrival process at an offered rate (burst rows have none): decode
    runs on the wall clock and capacity runs on the simulated one (``clock``, ``gpu``)."""
    df = with_mode(pd.concat([measured_as(rows, "decode"), ok_rows(rows, "capacity")]))
    if "request_rate" not in df:
        return df.iloc[0:0]
    df = df.dropna(subset=["request_rate"])
    if "arrival" in df:
        df = df[df["arrival"].astype(str) != "burst"]
    return df


def _vs_rate(rows: pd.DataFrame, y: str, ylabel: str, palette: dict, log: bool = False,
             left_out: list[str] | None = None) -> tuple[Figure, list] | None:
    """One panel per setting: ``y`` against the offered rate, one line per impl, one legend for all panels.
    A setting measured at one rate only, and those past ``MAX_FACETS``, are added to ``left_out`` with why."""
    left_out = [] if left_out is None else left_out
    df = service_rows(rows)
    if y not in df:
        return None
    df = df.dropna(subset=[y])
    if df.empty:
        return None
    # the clock always named: a simulated GPU's latency is a model's, not a measurement
    df["facet"] = facet_labels(df, [c for c in FACETS if c in df], always=(*ALWAYS, "clock", "gpu"))
    # Measured panels first (the wall clock), then rows this checkout's code measured, then the rest: past
    # MAX_FACETS panels are left out, and a simulated GPU's or an older run's are the ones to lose.
    stale = df["stale"].notna() if "stale" in df else pd.Series(False, index=df.index)
    rank = df.assign(simulated=df.get("clock", pd.Series("wall", index=df.index)) != "wall", stale=stale) \
        .groupby("facet")[["simulated", "stale"]].max()
    single = single_point_facets(df, "facet", "request_rate")
    left_out += [f"{f} (one rate only: its rows are in the table)" for f in single]
    facets = sorted(set(df["facet"]) - set(single),
                    key=lambda f: (bool(rank.loc[f, "simulated"]), bool(rank.loc[f, "stale"]), f))
    left_out += [f"{f} (past {MAX_FACETS} panels: its rows are in the table)" for f in facets[MAX_FACETS:]]
    facets = facets[:MAX_FACETS]
    if not facets:
        return None
    fig, axes = grid(len(facets), size=(5.4, 4.2))
    drawn: set[str] = set()
    for ax, facet in zip(axes, facets):
        sub = df[df["facet"] == facet]
        drawn |= set(impl_lines(ax, sub, "request_rate", y, palette))
        ax.set_title(wrap(facet))
        ax.set_xlabel("offered request rate (req/s)")
        ax.set_ylabel(ylabel)
        ax.set_xlim(left=0)
        if log:  # past its knee one impl's latency is 10-100x the others': a linear axis flattens them
            log_axis(ax)
        else:
            ax.set_ylim(bottom=0)
    figure_legend(fig, drawn, palette=palette)
    return fig, axes


def normalized_latency(rows: pd.DataFrame, palette: dict, left_out: list[str] | None = None) -> Figure | None:
    """Mean over requests of end-to-end latency / output tokens, vs offered rate (PagedAttention Fig. 12)."""
    drawn = _vs_rate(rows, "normalized_latency_s", "normalized latency (s/token)", palette, log=True,
                     left_out=left_out)
    if drawn is None:
        return None
    fig, _ = drawn
    fig.suptitle("Normalized latency vs request rate (log scale)\n(cf. PagedAttention Fig. 12; bars: min-max over runs)")
    return fig


def goodput(rows: pd.DataFrame, palette: dict, left_out: list[str] | None = None) -> Figure | None:
    """Requests per second that met every SLO, vs offered rate; the offered rate itself dashed."""
    drawn = _vs_rate(rows, "goodput_rps", "goodput (req/s meeting the SLO)", palette, left_out=left_out)
    if drawn is None:
        return None
    fig, axes = drawn
    for ax in axes:
        ax.axline((0, 0), slope=1, color="0.55", ls="--", lw=1, zorder=0, label="_offered")
    fig.suptitle("Goodput vs request rate\n(dashed: goodput = offered rate; bars: min-max over runs)")
    return fig


def _byte_unit(top: float) -> tuple[str, float]:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if top >= scale:
            return unit, scale
    return "bytes", 1.0


INTERPRETER = "triton-interpreter"  # kernel_backend of Triton on a CPU: an emulator's time, not a kernel's
# A KV-over-time panel: one setting under one arrival process on one clock, so each has its own time axis
# (a 3 s Poisson run beside an 80 s interpreter run would fill 4% of a shared one).
PANEL = ["model", "workload", "device_slug", "arrival", "timebase"]


def _timebase(runs: pd.DataFrame) -> pd.Series:
    """The clock a run's times are on: the row's ``clock`` (wall unless simulated), except that a run whose
    attention ran in the Triton interpreter has its own (its steps take the emulator's time)."""
    clock = runs["clock"].fillna("wall").astype(str) if "clock" in runs else pd.Series("wall", index=runs.index)
    if "kernel_backend" in runs:
        clock = clock.where(runs["kernel_backend"] != INTERPRETER, "Triton interpreter")
    return clock


def chosen_runs(steps: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """The decode runs whose steps are drawn, one per panel (``PANEL``) and impl: at the batch most of the
    panel's impls ran (the largest on a tie), the highest offered rate (burst has none), then the first run folder."""
    if steps.empty or not {"impl", "t_s", "kv_used_bytes", "kv_reserved_bytes"} <= set(steps.columns):
        return pd.DataFrame()
    decode = ok_rows(rows, "decode").drop_duplicates(["run_dir", "impl"])
    have = steps[["run_dir", "impl"]].drop_duplicates()
    runs = decode.merge(have, on=["run_dir", "impl"])
    if runs.empty:
        return runs
    rate = runs["request_rate"] if "request_rate" in runs else pd.Series(float("nan"), index=runs.index)
    arrival = runs["arrival"].fillna("burst").astype(str) if "arrival" in runs else "burst"
    runs = runs.assign(rate=rate.fillna(-1.0), arrival=arrival, timebase=_timebase(runs))
    if "batch" not in runs:
        runs["batch"] = float("nan")
    keys = [c for c in PANEL if c in runs]
    impls = runs.groupby(keys + ["batch"], dropna=False)["impl"].nunique().rename("impls").reset_index()
    best = impls.sort_values(["impls", "batch"], ascending=False).drop_duplicates(keys)
    runs = runs.merge(best[keys + ["batch"]], on=keys + ["batch"])
    runs = runs.sort_values(["rate", "run_dir"], ascending=[False, True])
    return runs.drop_duplicates(keys + ["impl"]).sort_values(keys + ["impl"]).reset_index(drop=True)


def _panel_order(panel: pd.DataFrame) -> tuple:
    """Arrivals over time before bursts (they show memory rising and falling), the wall clock before others."""
    first = panel.iloc[0]
    return first["arrival"] == "burst", first["timebase"] != "wall", str(first.get("facet", ""))


def _panel_title(panel: pd.DataFrame) -> str:
    first = panel.iloc[0]
    rates = sorted(panel.loc[panel["rate"] >= 0, "rate"].unique())
    if first["arrival"] == "burst":
        how = "burst: every request at t=0"
    elif len(rates) == 1:
        how = f"{first['arrival']} arrivals, {rates[0]:g} req/s"
    else:
        how = f"{first['arrival']} arrivals, each impl's highest rate ({rates[0]:g}-{rates[-1]:g} req/s)"
    batch = f" · B={first['batch']:g}" if pd.notna(first["batch"]) else ""
    clock = ("Triton interpreter (CPU emulation: its time is not a kernel's)" if first["timebase"] == "Triton interpreter"
             else f"{first['timebase']} clock")
    return f"{wrap(first['facet'])}\n{how}{batch}\n{clock}"


def _one_run(steps: pd.DataFrame, run_dir: str, impl: str) -> pd.DataFrame:
    """A run's steps for one impl, in order; if it holds several repeats, the first (time restarts)."""
    sub = steps[(steps["run_dir"] == run_dir) & (steps["impl"] == impl)]
    return sub[(sub["t_s"].diff() < 0).cumsum() == 0]


def _marks(t: pd.Series, k: int, n: int, count: int = 8) -> list[int]:
    """Where an impl's marker goes on its line: ``count`` steps evenly spaced in time, shifted by the impl's
    place ``k`` of ``n`` so that lines lying on one another still show each marker."""
    times = t.to_numpy()
    if len(times) == 0:
        return []
    span = times[-1] - times[0]
    targets = times[0] + span * (np.arange(count) + (k + 1) / (n + 1)) / count
    return sorted({int(i) for i in np.searchsorted(times, targets).clip(0, len(times) - 1)})


def kv_over_time(steps: pd.DataFrame, rows: pd.DataFrame, palette: dict) -> Figure | None:
    """KV memory reserved (dashed) and holding token states (solid) at every step, one run per impl;
    one panel per setting, arrival process and clock, each with its own time axis."""
    runs = chosen_runs(steps, rows)
    if runs.empty:
        return None
    runs["facet"] = facet_labels(runs, list(ALWAYS), always=ALWAYS)
    keys = [c for c in PANEL if c in runs]
    panels = sorted((panel for _, panel in runs.groupby(keys, dropna=False, sort=True)), key=_panel_order)[:MAX_FACETS]
    fig, axes = grid(len(panels), ncols_max=2, size=(6.0, 4.0))
    drawn: set[str] = set()
    budget_drawn = False
    for ax, panel in zip(axes, panels):
        traces = [(run.impl, _one_run(steps, run.run_dir, run.impl)) for run in panel.itertuples()]
        top = max(float(sub[["kv_used_bytes", "kv_reserved_bytes"]].max().max()) for _, sub in traces)
        unit, scale = _byte_unit(top if pd.notna(top) else 0)
        for k, (impl, sub) in enumerate(traces):
            colour, marker = colour_of(impl, palette), impl_style(impl).marker
            ax.plot(sub["t_s"], sub["kv_reserved_bytes"] / scale, color=colour, ls="--", lw=1.3,
                    drawstyle="steps-post", label="_reserved")
            ax.plot(sub["t_s"], sub["kv_used_bytes"] / scale, color=colour, ls="-", lw=1.6, drawstyle="steps-post",
                    marker=marker, markevery=_marks(sub["t_s"], k, len(traces)), markersize=6, label=impl)
            drawn.add(impl)
        budget = panel["budget_kv_bytes"].dropna() if "budget_kv_bytes" in panel else []
        if len(budget) and budget.nunique() == 1:
            if budget.iloc[0] <= 1.5 * top:
                ax.axhline(budget.iloc[0] / scale, color="black", ls=":", lw=1.2, label="_budget")
                budget_drawn = True
            else:  # a line far above the runs would flatten them: named instead
                ax.text(0.98, 0.97, f"KV budget {budget.iloc[0] / scale:.3g} {unit} (off scale)", transform=ax.transAxes,
                        ha="right", va="top", fontsize=8, color="0.2",
                        bbox={"facecolor": "white", "edgecolor": "0.8", "boxstyle": "round,pad=0.3"})
                ax.set_ylim(top=1.2 * top / scale)  # room for the note above the runs
        ax.set_title(_panel_title(panel))
        ax.set_xlabel("time since the run started (s)")
        ax.set_ylabel(f"KV cache ({unit})")
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
    memory = [dash_handle("reserved", "--"), dash_handle("holding token states", "-")]
    if budget_drawn:
        memory.append(dash_handle("KV budget", ":", "black", 1.2))
    figure_legend(fig, drawn, [("KV memory", memory)], palette)
    fig.suptitle(f"KV memory over time, one run per impl and panel\n(its highest offered rate, on {devices(runs)})")
    return fig


def max_rate_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per setting and impl: the largest rate that passed the SLO (median over runs) and its ratio to contiguous."""
    df = with_mode(measured_as(rows, "max_rate"))
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
