"""What every report figure shares: the theme, colours, facet labels, axis helpers, saving."""

from __future__ import annotations

import math
import numbers
import textwrap
from contextlib import contextmanager
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a window

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter  # noqa: E402

GB = 1e9  # memory axes are in GB (10^9 bytes), the unit of device.memory_gb and the seeds' figures
MAX_FACETS = 6  # more panels than this stop being readable; the rest are named in the caption
KNOWN_IMPLS = ["contiguous", "paged", "paged_torch", "paged_triton", "paged_cuda", "orca_pow2", "orca_oracle"]


@contextmanager
def theme():
    """Seaborn's grid theme plus what makes the files byte-for-byte reproducible."""
    rc = {"svg.hashsalt": "kvbench", "figure.dpi": 100, "savefig.dpi": 130, "axes.titlesize": 11}
    with sns.axes_style("whitegrid"), sns.plotting_context("notebook", font_scale=0.9), plt.rc_context(rc):
        yield


def save(fig: Figure, out_dir: Path, name: str) -> list[Path]:
    """``<name>.png`` and ``<name>.svg`` (no timestamps); closes the figure but returns nothing of it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.svg"]
    fig.savefig(paths[0], metadata={"Software": None})
    fig.savefig(paths[1], metadata={"Date": None, "Creator": None})
    plt.close(fig)
    return paths


def impl_palette(impls) -> dict[str, tuple]:
    """One colour per impl, the same in every figure of a report."""
    names = [i for i in KNOWN_IMPLS if i in set(impls)] + sorted(set(impls) - set(KNOWN_IMPLS))
    colours = sns.color_palette("colorblind", max(len(names), 1))
    return dict(zip(names, colours))


def devices(df: pd.DataFrame) -> str:
    names = sorted(df["device_slug"].dropna().astype(str).unique()) if "device_slug" in df else []
    return ", ".join(names) or "unknown device"


def fmt_bytes(b: float) -> str:
    if b is None or pd.isna(b):
        return "-"
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(b) >= scale:
            return f"{b / scale:.3g} {unit}"
    return f"{b:.0f} B"


_SHOW = {
    "batch": lambda v: f"B={v:g}",
    "kernel_batch": lambda v: f"B={v:g}",
    "block_size": lambda v: f"block {v:g}",
    "max_seq_len": lambda v: f"max_seq_len {v:g}",
    "budget_kv_bytes": lambda v: f"KV budget {fmt_bytes(v)}",
    "n": lambda v: f"n={v:g}",
    "shared_prefix_len": lambda v: f"prefix {v:g}",
}


def show(col: str, v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return f"{col}=?"
    return _SHOW[col](v) if col in _SHOW and isinstance(v, numbers.Number) else str(v)


def facet_labels(df: pd.DataFrame, cols: list[str], always: tuple[str, ...] = ()) -> pd.Series:
    """A label per row naming the columns in ``always`` and those that vary across ``df``."""
    shown = [c for c in cols if c in df.columns and (c in always or df[c].nunique(dropna=False) > 1)]
    if not shown:
        return pd.Series("", index=df.index)
    return df[shown].apply(lambda r: " · ".join(show(c, r[c]) for c in shown), axis=1)


def wrap(label: str, width: int = 44) -> str:
    """A facet label over several lines, broken between its `` · `` parts."""
    lines: list[str] = []
    for part in label.split(" · "):
        if lines and len(lines[-1]) + 3 + len(part) <= width:
            lines[-1] += " · " + part
        else:
            lines.append(part)
    return "\n".join(textwrap.shorten(ln, 2 * width) for ln in lines)


def powers_of_two(values) -> bool:
    vals = sorted({float(v) for v in values if v is not None and not pd.isna(v)})
    return len(vals) >= 2 and vals[-1] / vals[0] >= 4 and all(v > 0 and math.log2(v).is_integer() for v in vals)


def count_axis(ax, values, axis: str = "x") -> None:
    """Ticks at the measured values; log2 scale when they are powers of two spanning 4x or more."""
    vals = sorted({float(v) for v in values if not pd.isna(v)})
    if not vals:
        return
    axis_obj = ax.xaxis if axis == "x" else ax.yaxis
    if powers_of_two(vals):
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log", base=2)
    if len(vals) <= 12:
        axis_obj.set_major_locator(FixedLocator(vals))
        axis_obj.set_minor_locator(NullLocator())
    fmt = ScalarFormatter()
    fmt.set_scientific(False)
    axis_obj.set_major_formatter(fmt)


def grid(n: int, ncols_max: int = 3, size=(5.0, 3.8), **kw):
    """``n`` panels in rows of at most ``ncols_max``; unused panels removed."""
    ncols = max(1, min(ncols_max, n))
    nrows = max(1, math.ceil(n / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(size[0] * ncols, size[1] * nrows), squeeze=False,
                             layout="constrained", **kw)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.remove()
    return fig, flat[:n]


def legend_outside(ax, title: str | None = None) -> None:
    """The axes' legend to its right, so it never covers data."""
    if ax.get_legend() is not None:
        sns.move_legend(ax, "upper left", bbox_to_anchor=(1.02, 1), title=title, frameon=False)


def drop_legend(ax) -> None:
    if ax.get_legend() is not None:
        ax.get_legend().remove()
