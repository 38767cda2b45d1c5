"""scenarios/: what a job measures. Each scenario is one module here (its schema and its ``run``).

context.py holds what every scenario of one job shares (``JobContext``); profile_grid.py, the grid
scenario=profile measures and how; wall_check.py, the wall runs a validating profile job serves
(scenario=profile's parts, beside it). A scenario
module imports serving/, kv/, measure/, model/ and the schema at call time (its top
stays light: reading a config never loads torch); nothing from job/ or front/.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from types import ModuleType

NOT_SCENARIOS = ("context", "profile_grid", "wall_check")  # modules of this package that are not scenarios (shared parts)


def module(name: str) -> ModuleType:
    """The scenario ``name``'s module: its ``SCHEMA`` (the option ``scenario=NAME``) and its ``run(ctx, impl)``."""
    return importlib.import_module(f"{__name__}.{name}")


@cache
def schemas() -> dict:
    """``{name: schema dataclass}`` for every scenario module here: adding a scenario is adding its module."""
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name not in NOT_SCENARIOS)
    return {name: module(name).SCHEMA for name in names}
