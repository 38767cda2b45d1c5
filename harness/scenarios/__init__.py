"""scenarios/: what a job measures. Each scenario is one module here (its schema and its ``run``).

A scenario's ``run`` receives the pieces of its job that its signature names (context.py ``PIECES``):
``job`` (job_run.py: config, run folder, memo, identifiers), ``workload`` (job_workload.py), ``compute``
(compute.py: the model), ``budget`` (job_budget.py: the measured KV budget), ``out`` (outputs.py: side
tables and tokens); context.py assembles them. profile_grid.py holds the grid scenario=profile measures
and how; wall_check.py, the wall runs a validating profile job serves (scenario=profile's parts, beside
it). A scenario module imports serving/, kv/, measure/, model/ and the schema at call time (its top
stays light: reading a config never loads torch); nothing from job/ or front/.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from types import ModuleType

# modules of this package that are not scenarios: a job's pieces and their assembly, and scenario=profile's parts
NOT_SCENARIOS = ("after_idle_probe", "compute", "context", "job_budget", "job_run", "job_workload", "outputs", "profile_grid", "wall_check")


def module(name: str) -> ModuleType:
    """The scenario ``name``'s module: its ``SCHEMA`` (the option ``scenario=NAME``) and its ``run(impl, <pieces>)``."""
    return importlib.import_module(f"{__name__}.{name}")


@cache
def schemas() -> dict:
    """``{name: schema dataclass}`` for every scenario module here: adding a scenario is adding its module."""
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name not in NOT_SCENARIOS)
    return {name: module(name).SCHEMA for name in names}
