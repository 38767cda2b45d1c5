"""One colour and one marker per impl, the same in every figure of every report, and the legends that name them.

The styles are fixed by name, not by which impls a report happens to hold: a figure of three impls
and one of eight give contiguous the same blue circle. A name outside ``KNOWN`` (an external system
such as ``vllm``) gets a colour and a marker from its name's CRC-32, so it too keeps them from one
report to the next; two such names can share a colour, rarely also a marker.

Line style is never an impl's: figures keep it for a second variable (CUDA graphs, a kernel's layout,
reserved vs holding token states), so an impl is told by colour and marker alone.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pandas as pd
import seaborn as sns
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.lines import Line2D

from kvbench.harness.report.selection import contended_rows


@dataclass(frozen=True)
class ImplStyle:
    colour: str  # "#rrggbb"
    marker: str  # a matplotlib marker


# seaborn's colour-blind palette (Okabe-Ito's, as seaborn gives it), by place: 0 blue, 1 orange, 2 green,
# 3 vermillion, 4 pink, 5 tan, 6 light pink, 7 grey, 8 yellow, 9 sky blue.
COLOURBLIND: tuple[str, ...] = tuple(c.upper() for c in sns.color_palette("colorblind").as_hex())
# seaborn's dark palette: 0 navy, 3 dark red, 4 purple, 5 dark brown, 6 magenta, 8 ochre, 9 teal.
DARK: tuple[str, ...] = tuple(c.upper() for c in sns.color_palette("dark").as_hex())

# conf/impl/'s names (tests/unit/harness/report/test_palette.py checks the two agree), in legend order:
# the contiguous cache and its Orca variants, then the paged ones. Colours: seaborn's colour-blind palette
# by fixed place (never by which impls a figure holds), without its yellow and light pink (too faint on
# white) and its grey (the colour of the legends' dash entries); paged, the eighth, takes the dark palette's
# purple. An alias (orca_max, paged) has a colour of its own, so a report holding both names tells them apart.
KNOWN: dict[str, ImplStyle] = {
    "contiguous": ImplStyle(COLOURBLIND[0], "o"),
    "orca_max": ImplStyle(COLOURBLIND[9], "p"),
    "orca_pow2": ImplStyle(COLOURBLIND[4], "X"),
    "orca_oracle": ImplStyle(COLOURBLIND[5], "s"),
    "paged": ImplStyle(DARK[4], "v"),
    "paged_torch": ImplStyle(COLOURBLIND[1], "D"),
    "paged_triton": ImplStyle(COLOURBLIND[2], "^"),
    "paged_cuda": ImplStyle(COLOURBLIND[3], "P"),
    # torch's FlexAttention, the field's reference kernel: black, as a baseline is drawn (no palette place is left
    # that is not another impl's or a fallback's; the budget and peak lines are black too, but dashed, unmarked)
    "paged_flex": ImplStyle("#000000", "h"),
}
KNOWN_IMPLS: tuple[str, ...] = tuple(KNOWN)
# For other names: seaborn's dark palette less paged's purple and its near twins of a known impl's colour
# (its dark orange and green) and of the dash entries' grey; none of these markers is a known impl's.
FALLBACK_COLOURS = tuple(DARK[i] for i in (3, 5, 6, 8, 9, 0))
FALLBACK_MARKERS = ("*", "d", "H", "<", ">", "8")

# Dash patterns for a figure's second variable, most distinct first.
DASHES: tuple = ("-", (0, (5, 2)), (0, (1, 1.5)), (0, (6, 2, 1, 2)), (0, (11, 3)), (0, (3, 1, 1, 1, 1, 1)))
MARKER_SIZE = 7.0
# A point with a row measured while the machine was busy (``contended``, harness/report/selection.py) is drawn
# like the others and ringed, so a reader sees it and weighs it; the legend names the ring.
FLAGGED_LABEL = "flagged (machine busy)"
FLAGGED_ARTIST = "_flagged"  # the ring's own label: no impl's, found again by ``figure_legend``
FLAGGED_RING = {"marker": "o", "markersize": 2.2 * MARKER_SIZE, "markerfacecolor": "none", "markeredgecolor": "black",
                "markeredgewidth": 1.6, "ls": "none"}


def impl_style(name: str) -> ImplStyle:
    """The impl's fixed style; a name outside ``KNOWN`` gets one from its CRC-32 (Python's ``hash`` of a
    string changes from one process to the next, so it would not be the same in the next report)."""
    if name in KNOWN:
        return KNOWN[name]
    h = zlib.crc32(name.encode())
    return ImplStyle(FALLBACK_COLOURS[h % len(FALLBACK_COLOURS)],
                     FALLBACK_MARKERS[(h // len(FALLBACK_COLOURS)) % len(FALLBACK_MARKERS)])


def impl_order(names: Iterable[str]) -> list[str]:
    """Known impls in ``KNOWN``'s order, then any others alphabetically: the order of every legend."""
    present = {str(n) for n in names if isinstance(n, str) and n}
    return [n for n in KNOWN_IMPLS if n in present] + sorted(present - set(KNOWN_IMPLS))


def colour_of(name: str, palette: dict | None = None):
    """The caller's colour for ``name`` if it gave one (tests pass their own), else the fixed one."""
    return (palette or {}).get(name, impl_style(name).colour)


def impl_handle(name: str, palette: dict | None = None) -> Line2D:
    """A legend entry: the impl's colour and marker on a solid line."""
    return Line2D([], [], color=colour_of(name, palette), marker=impl_style(name).marker, markersize=MARKER_SIZE,
                  lw=1.8, label=name)


def dash_handle(label: str, dashes, colour: str = "0.3", lw: float = 1.5) -> Line2D:
    return Line2D([], [], color=colour, ls=dashes, lw=lw, label=label)


def flagged_handle() -> Line2D:
    """The legend entry of the ring ``impl_lines`` draws around a flagged point."""
    return Line2D([], [], label=FLAGGED_LABEL, **FLAGGED_RING)


def has_flagged(fig: Figure) -> bool:
    """Some panel of ``fig`` rings a flagged point."""
    return any(line.get_label() == FLAGGED_ARTIST for ax in fig.axes for line in ax.lines)


def _header(title: str) -> Line2D:
    return Line2D([], [], ls="none", label=title)


def figure_legend(fig: Figure, impls: Iterable[str], sections: Sequence[tuple[str, list[Artist]]] = (),
                  palette: dict | None = None, loc: str = "outside right upper", ncol: int = 1,
                  title: str | None = "impl") -> Legend:
    """The figure's one legend: every impl drawn in any of its panels, then each (title, entries) section.

    Built from the impls, not from one panel's lines, so an impl drawn in one panel only is still named; a
    figure with a flagged point gets the ring's entry too."""
    handles: list[Artist] = [_header(title)] if title else []
    headers = {title} if title else set()
    handles += [impl_handle(name, palette) for name in impl_order(impls)]
    if has_flagged(fig):
        sections = [*sections, ("measured while busy", [flagged_handle()])]
    for head, entries in sections:
        if entries:
            handles += [_header(head), *entries]
            headers.add(head)
    legend = fig.legend(handles=handles, loc=loc, ncol=ncol, frameon=False, fontsize=9, handlelength=2.6)
    for text in legend.get_texts():
        if text.get_text() in headers:
            text.set_fontweight("bold")
    return legend


def legend_labels(fig: Figure) -> list[str]:
    """Every label in the figure's legends (tests and callers check what a reader can identify)."""
    return [t.get_text() for legend in fig.legends for t in legend.get_texts()]


def drawn_impls(fig: Figure) -> set[str]:
    """The impls with a line or bar in any panel (their artists are labelled with the impl's name)."""
    names = set()
    for ax in fig.axes:
        names |= {a.get_label() for a in [*ax.lines, *ax.containers] if not a.get_label().startswith("_")}
    return names


def figure_problems(fig: Figure, palette: dict | None = None) -> list[str]:
    """What a reader could not rely on in a figure, one line each (none: all is well): an empty panel, an
    impl drawn in another colour or marker than its own, a labelled line or bar no legend or tick names."""
    problems = []
    named = set(legend_labels(fig))
    for n, ax in enumerate(fig.axes, start=1):
        where = f"panel {n} ({ax.get_title().splitlines()[0] if ax.get_title() else 'untitled'})"
        if not (ax.lines or ax.patches or ax.collections or ax.images):
            problems.append(f"{where} is empty")
        ticks = {t.get_text() for t in [*ax.get_xticklabels(), *ax.get_yticklabels()]}
        for line in ax.lines:
            label = line.get_label()
            if label.startswith("_"):
                continue
            if label not in named:
                problems.append(f"{where}: {label} is in no legend")
            if label in KNOWN or label in (palette or {}):
                want = impl_style(label)
                if to_hex(line.get_color()) != to_hex(colour_of(label, palette)):
                    problems.append(f"{where}: {label} drawn in {to_hex(line.get_color())}")
                if line.get_marker() not in (want.marker, "None", None, ""):
                    problems.append(f"{where}: {label} drawn with marker {line.get_marker()!r}")
        for bars in ax.containers:
            label = bars.get_label()
            if not label.startswith("_") and label not in named | ticks:
                problems.append(f"{where}: bars of {label} named by no legend or tick")
    for legend in fig.legends:
        for handle, text in zip(legend.legend_handles, legend.get_texts()):
            label = text.get_text()
            if label in KNOWN and isinstance(handle, Line2D):
                if (to_hex(handle.get_color()), handle.get_marker()) != (to_hex(colour_of(label, palette)),
                                                                        impl_style(label).marker):
                    problems.append(f"legend: {label} is not in its own colour and marker")
    return problems


def impl_lines(ax: Axes, df: pd.DataFrame, x: str, y: str, palette: dict | None = None,
               dash_by: str | None = None, dash_order: Sequence | None = None) -> list[str]:
    """One line per impl (and per value of ``dash_by``, told by its dashes): the mean over runs at each
    ``x``, with min-max bars where runs differ, and a ring (``FLAGGED_RING``) where a row of the point was
    measured while the machine was busy; the impls drawn, in legend order."""
    df = df.dropna(subset=[x, y])
    flags = contended_rows(df)
    values = list(dash_order) if dash_order is not None else (sorted(df[dash_by].dropna().unique()) if dash_by else [])
    drawn = impl_order(df["impl"].unique())
    for impl in drawn:
        colour, marker = colour_of(impl, palette), impl_style(impl).marker
        mine = df[df["impl"] == impl]
        groups = [(None, mine)] if dash_by is None else list(mine.groupby(dash_by, dropna=False, sort=False))
        # a value outside the order (or missing) is drawn solid; groups in the order's order, so files repeat
        placed = sorted(((values.index(v) if v in values else -1, n) for n, (v, _) in enumerate(groups)))
        for place, n in placed:
            sub = groups[n][1]
            dashes = DASHES[max(place, 0) % len(DASHES)]
            stats = sub.groupby(x)[y].agg(["mean", "min", "max"]).sort_index()
            ax.plot(stats.index, stats["mean"], color=colour, marker=marker, markersize=MARKER_SIZE,
                    ls=dashes, lw=1.6, label=impl)
            if (stats["max"] > stats["min"]).any():  # bars only where repeats or runs disagree
                ax.errorbar(stats.index, stats["mean"], yerr=[stats["mean"] - stats["min"], stats["max"] - stats["mean"]],
                            fmt="none", ecolor=colour, elinewidth=1, capsize=3, label="_spread")
            busy = set(sub.loc[flags.reindex(sub.index, fill_value=False), x])
            if busy:
                ringed = stats[stats.index.isin(busy)]
                ax.plot(ringed.index, ringed["mean"], label=FLAGGED_ARTIST, **FLAGGED_RING)
    return drawn



def dash_entries(values: Sequence, order: Sequence | None = None, label=str) -> list[Line2D]:
    """Legend entries for the ``dash_by`` values drawn, each with the dashes ``impl_lines`` gave it
    (its place in ``order``, the ``dash_order`` passed there; by default ``values`` itself)."""
    order = list(values) if order is None else list(order)
    return [dash_handle(label(v), DASHES[order.index(v) % len(DASHES)]) for v in values]
