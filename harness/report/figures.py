"""What every report figure shares: the theme, colours, facet labels, axis helpers, saving."""

from __future__ import annotations

import io
import math
import numbers
import re
import textwrap
from contextlib import contextmanager
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a window

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from kvbench.harness.results import atomic_write  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FixedLocator, LogFormatterSciNotation, NullLocator, ScalarFormatter  # noqa: E402

# KNOWN_IMPLS is palette's (the impls with a fixed style), kept importable from here
from kvbench.harness.report.palette import KNOWN_IMPLS, impl_order, impl_style  # noqa: E402, F401

GB = 1e9  # memory axes are in GB (10^9 bytes), the unit of device.memory_gb and the seeds' figures
MAX_FACETS = 6  # more panels than this stop being readable; the rest are named in the caption
DEFAULT_BLOCK_SIZE = 16  # conf/config.yaml's block_size (a test checks): other sizes are a sweep around it
SAVE_DPI = 130  # the PNGs' resolution, lowered for a figure so large that a side would pass MAX_PIXELS
MAX_PIXELS = 2000  # the longest side of a PNG: one screen, readable without zooming out


@contextmanager
def theme():
    """Seaborn's grid theme plus what makes the files byte-for-byte reproducible."""
    rc = {"svg.hashsalt": "kvbench", "figure.dpi": 100, "savefig.dpi": SAVE_DPI, "axes.titlesize": 11}
    with sns.axes_style("whitegrid"), sns.plotting_context("notebook", font_scale=0.9), plt.rc_context(rc):
        yield


# Each file is drawn into a temporary twin and renamed over its name (harness/results.atomic_write): a link
# planted at plots/<name>.png is replaced, never written through (SECURITY.md).
def png_dpi(fig: Figure) -> float:
    """``SAVE_DPI``, or less where the figure's longer side would pass ``MAX_PIXELS`` at it."""
    return min(float(SAVE_DPI), MAX_PIXELS / max(fig.get_size_inches()))


def _png(fig: Figure, path: Path) -> None:
    atomic_write(Path(path), lambda tmp: fig.savefig(tmp, format="png", dpi=png_dpi(fig), metadata={"Software": None}))


# matplotlib names an SVG's clip paths, markers and hatches by a hash of their full-precision geometry: a
# clip box a millionth of a point off (a figure drawn after another in the same process, or in a fresh one)
# gets a new name, and a published plot whose drawing is the same to the printed digit came out changed.
_SVG_ID = re.compile(r'(?<=id=")[pmh][0-9a-f]{10}(?=")|(?<=url\(#)[pmh][0-9a-f]{10}(?=\))|(?<=xlink:href="#)[pmh][0-9a-f]{10}(?=")')


def stable_svg_ids(text: str) -> str:
    """``text`` with matplotlib's hashed ids renamed by first appearance (clip0, clip1 ...; one prefix a kind):
    the file then depends only on what it draws, to the digits it prints."""
    names: dict[str, str] = {}
    counts = {"p": 0, "m": 0, "h": 0}
    kinds = {"p": "clip", "m": "marker", "h": "hatch"}

    def rename(match: re.Match) -> str:
        old = match.group(0)
        if old not in names:
            names[old] = f"{kinds[old[0]]}{counts[old[0]]}"
            counts[old[0]] += 1
        return names[old]

    return _SVG_ID.sub(rename, text)


def _svg(fig: Figure, path: Path) -> None:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = stable_svg_ids(buf.getvalue())
    atomic_write(Path(path), lambda tmp: tmp.write_text(text))


def save(fig: Figure, out_dir: Path, name: str) -> list[Path]:
    """``<name>.png`` and ``<name>.svg`` (no timestamps); closes the figure but returns nothing of it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.svg"]
    _png(fig, paths[0])
    _svg(fig, paths[1])
    plt.close(fig)
    return paths


def _write_pngs(pickled: list[tuple[bytes, str]]) -> None:
    """A worker's half of ``save_all``: each pickled figure drawn into its PNG, in the report's theme."""
    import pickle

    with theme():
        for blob, path in pickled:
            fig = pickle.loads(blob)
            _png(fig, Path(path))
            plt.close(fig)


def _finished(job) -> bool:
    """The worker's PNGs are written (False: no worker, or it died or failed)."""
    if job is None:
        return False
    try:
        job.result()
    except Exception:  # noqa: BLE001 - a dead worker (BrokenProcessPool) or its error: drawn here instead
        return False
    return True


def save_all(figures: dict[str, Figure], out_dir: Path) -> list[Path]:
    """``save`` of every figure, the PNGs drawn in a second process while this one draws the SVGs.

    Drawing is most of a report's time (38 of 91 s for this project's results on a 2-core machine),
    and each figure is drawn twice, once per format. The worker gets the figures pickled and draws
    them in the same theme, so its PNGs are the ones ``save`` writes, byte for byte; the SVGs, no
    longer drawn right after a PNG, differ from ``save``'s by a millionth of a point of layout and are
    the same from run to run. Where a figure cannot be pickled or the worker fails, this process draws
    the PNGs itself."""
    import pickle
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    out_dir.mkdir(parents=True, exist_ok=True)
    items = [(fig, out_dir / f"{name}.png", out_dir / f"{name}.svg") for name, fig in figures.items()]
    try:
        pickled = [(pickle.dumps(fig), str(png)) for fig, png, _ in items]
    except Exception:  # noqa: BLE001 - an artist without pickling support: draw them here, one after the other
        pickled = None
    pool = ProcessPoolExecutor(1, mp_context=get_context("spawn")) if pickled and len(items) > 1 else None
    try:
        pngs = pool.submit(_write_pngs, pickled) if pool is not None else None
        for fig, _, svg in items:
            _svg(fig, svg)
        if not _finished(pngs):
            for fig, png, _ in items:
                _png(fig, png)
    finally:
        if pool is not None:
            pool.shutdown()
        for fig, _, _ in items:
            plt.close(fig)
    return [path for _, png, svg in items for path in (png, svg)]


def single_point_facets(df: pd.DataFrame, facet: str, x: str) -> list[str]:
    """The facets whose rows sit at one ``x`` only: a panel of dots with no line between them reads better as
    the rows of the section's table, so the figure leaves them out and REPORT.md names them."""
    if df.empty:
        return []
    counts = df.groupby(facet, sort=True)[x].nunique()
    return [str(f) for f in counts.index[counts <= 1]]


def impl_palette(impls) -> dict[str, str]:
    """Each impl's colour: harness.report.palette's fixed one, the same in every figure and every report."""
    return {name: impl_style(name).colour for name in impl_order(impls)}


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


_SHOW_TEXT = {  # text values that read better with their column named
    "clock": lambda v: f"{v} clock",
    "chunked_prefill": lambda v: "chunked prefill" if v else "whole-prompt prefill",
    "gpu": lambda v: f"GPU {v}",
}
_SHOW = {
    "batch": lambda v: f"B={v:g}",
    "kernel_batch": lambda v: f"B={v:g}",
    "block_size": lambda v: f"block {v:g}",
    "max_seq_len": lambda v: f"max_seq_len {v:g}",
    "budget_kv_bytes": lambda v: f"KV budget {fmt_bytes(v)}",
    "n": lambda v: f"n={v:g}",
    "shared_prefix_len": lambda v: f"prefix {v:g}",
    "chunked_prefill": lambda v: "chunked prefill" if v else "whole-prompt prefill",  # a bool is a Number
}


def show(col: str, v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return f"{col}=?"
    if col in _SHOW and isinstance(v, numbers.Number):
        return _SHOW[col](v)
    return _SHOW_TEXT[col](v) if col in _SHOW_TEXT else str(v)


def _missing(v) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))


def facet_labels(df: pd.DataFrame, cols: list[str], always: tuple[str, ...] = ()) -> pd.Series:
    """A label per row naming the columns in ``always`` and those that vary across ``df``."""
    shown = [c for c in cols if c in df.columns and (c in always or df[c].nunique(dropna=False) > 1)]
    if not shown:
        return pd.Series("", index=df.index)
    # A missing value is a column that does not apply to the row (a wall-clock run has no simulated GPU):
    # left out of its label rather than shown as "gpu=?".
    return df[shown].apply(lambda r: " · ".join(show(c, r[c]) for c in shown if not _missing(r[c])), axis=1)


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


class PlainLogFormatter(LogFormatterSciNotation):
    """Log-axis labels as plain numbers (0.01, 20, 300) where matplotlib would write 10^-2 or 2x10^1;
    which ticks get a label is still matplotlib's choice."""

    def __call__(self, x, pos=None):
        return f"{x:g}" if super().__call__(x, pos) else ""


def log_axis(ax, axis: str = "y") -> None:
    """A log scale whose ticks read as plain numbers."""
    (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
    axis_obj = ax.yaxis if axis == "y" else ax.xaxis
    axis_obj.set_major_formatter(PlainLogFormatter())
    axis_obj.set_minor_formatter(PlainLogFormatter())


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
