"""Which clock prices a simulated run: a measured profile (``clock_profile=``), else the roofline of
``gpu=NAME``, else none (bookkeeping alone). Rows name it in ``clock_source``: the profile's id, or
``roofline-vN`` with the formula's version (harness/serving/cost_model.py), so a row says which
formula priced it."""

from __future__ import annotations

from harness.config import Config
from harness.serving.cost_model import ROOFLINE_VERSION, CostModel, cost_model_for
from harness.serving.profile_table import load_clock
from harness.serving.profiled_clock import ProfiledClock

ROOFLINE = f"roofline-v{ROOFLINE_VERSION}"


def step_clock(cfg: Config, impl: str) -> tuple[ProfiledClock | CostModel | None, str | None]:
    """(clock, its name for the rows): a profile's id, ``roofline``, or (None, None)."""
    if cfg.clock_profile is not None:
        clock = load_clock(cfg.clock_profile, cfg.clock_profile_impl or impl)
        if cfg.gpu is not None:  # the roofline prices the shapes the profile did not measure
            clock.fallback = cost_model_for(cfg)
        return clock, clock.id
    if cfg.gpu is not None:
        return cost_model_for(cfg), ROOFLINE
    return None, None


def outside_note(clock) -> str | None:
    """The row's note when a profile priced steps beyond the shapes it measured."""
    outside = getattr(clock, "outside", 0)
    how = "by the roofline of gpu=NAME" if getattr(clock, "fallback", None) is not None else "its end segments extended"
    return f"{outside} steps priced outside the profile's batches, contexts or prefill sizes ({how})" if outside else None
