"""The checks every config group's validation is made of (harness/front/resolve.py runs them).

A failed check is a ``ConfigError`` whose message names the key and, for a choice, the allowed values;
the two walks over the whole config check every integer against the rows' int64 columns and every float
for being finite.
"""

from __future__ import annotations

import dataclasses
import math

from kvbench.harness.errors import INT64_MAX, ConfigError
from kvbench.harness.paths import CONF_DIR


def choices(group: str) -> list[str]:
    """The options of conf/GROUP/ (its files' names)."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def one_of(key: str, value: str, allowed) -> None:
    check(value in allowed, f"{key}={value!r} is not allowed; allowed: {', '.join(map(str, allowed))}")


def check_int_ranges(node: object, prefix: str = "") -> None:
    """Every integer key of the config (nested groups and lists too) fits the rows' int64 columns."""
    for f in dataclasses.fields(node):
        value, key = getattr(node, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            check_int_ranges(value, f"{key}.")
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, int) and not isinstance(item, bool) and not -INT64_MAX - 1 <= item <= INT64_MAX:
                raise ConfigError(f"{key}={item} is out of range: an integer key is at most {INT64_MAX} (int64)")


def check_finite_floats(node: object, prefix: str = "") -> None:
    """Every float key of the config (nested groups and lists too) is finite: inf and nan size nothing.

    Runs after the keys' own checks (whose messages say more), before any value sizes anything."""
    for f in dataclasses.fields(node):
        value, key = getattr(node, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            check_finite_floats(value, f"{key}.")
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, float) and not math.isfinite(item):
                raise ConfigError(f"{key}={item} must be a finite number")

