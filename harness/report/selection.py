"""Which rows a figure or table reads: measured ones, the rows that measured what a scenario measures, the
decode mode of each, burst runs, points without repeats; and which were measured under contention."""

from __future__ import annotations

import pandas as pd

from kvbench.harness.results import as_bool

# Where a figure is the KV accounting alone (capacity rows: bookkeeping, no tensors), the device it ran on says
# nothing about it: one label for all, so two machines' identical rows are one bar, not two.
ANY_DEVICE = "any (KV accounting)"


def ok_rows(df: pd.DataFrame, scenario: str | None = None) -> pd.DataFrame:
    """Rows that measured something: failed rows stay in the table but are never plotted."""
    sel = df["status"] == "ok"
    if scenario is not None:
        sel &= df["scenario"] == scenario
    return df[sel].copy()


def measured_as(df: pd.DataFrame, scenario: str) -> pd.DataFrame:
    """Ok rows that measured what ``scenario`` measures: its own, and a validating profile job's wall-clock
    rows of that kind (harness/scenarios/wall_check.py: ``decode``, a rate served; ``max_rate``, the search),
    which keep ``scenario=profile``, the job that ran them."""
    own = ok_rows(df, scenario)
    if scenario not in ("decode", "max_rate") or "clock" not in df:
        return own
    wall = ok_rows(df, "profile")
    wall = wall[wall["clock"] == "wall"]
    searched = wall["max_rate_rps"].notna() if "max_rate_rps" in wall else pd.Series(False, index=wall.index)
    wall = wall[searched] if scenario == "max_rate" else wall[~searched]
    return pd.concat([f for f in (own, wall) if not f.empty], ignore_index=True) if not wall.empty else own


def contended_rows(df: pd.DataFrame) -> pd.Series:
    """True for rows measured while the process did not get the CPU it asked for (harness/measure/contention.py);
    rows from before the column existed are not flagged."""
    if "contended" not in df:
        return pd.Series(False, index=df.index)
    return df["contended"].fillna(False).astype(bool)


MODES = ["eager", "CUDA graphs", "compiled"]  # the style order: eager lines solid, the others dashed


def with_mode(df: pd.DataFrame) -> pd.DataFrame:
    """Each decode row's ``mode``: ``CUDA graphs`` (cuda_graph=true: the dense work replayed),
    ``compiled`` (cpu_compile: the dense work compiled by inductor on a CPU) or ``eager`` (also rows
    from before the switches existed). They are different measurements of one impl, so figures and
    tables keep them apart instead of averaging them."""
    def flag(name: str) -> pd.Series:
        values = df[name] if name in df else pd.Series(False, index=df.index)
        return values.map(lambda v: as_bool(v) is True).astype(bool)

    graphs, compiled = flag("cuda_graph"), flag("cpu_compile")
    mode = pd.Series("eager", index=df.index).where(~graphs, "CUDA graphs").where(~compiled, "compiled")
    return df.assign(mode=mode)


def burst(df: pd.DataFrame) -> pd.DataFrame:
    """Rows whose requests all arrived at once (rows from before arrivals existed have no arrival):
    throughput figures compare these; a run under an arrival process is limited by its offered rate."""
    if "arrival" not in df:
        return df
    return df[df["arrival"].isna() | (df["arrival"].astype(str) == "burst")]


def unique_points(points: pd.DataFrame) -> pd.DataFrame:
    """Points tables without repeats: every job of a sweep writes the same impl-independent table."""
    if points.empty:
        return points
    key = [c for c in points.columns if c not in ("run_dir", "run_id", "kv_bytes_reserved", "kv_bytes_used")]
    return points.drop_duplicates(subset=key, keep="first").reset_index(drop=True)
