"""Errors the entry point turns into one-line messages (no traceback wall), and the checks that raise them
on numbers read from a file (a trace, a config.json): checked as they are, before any cast."""

from __future__ import annotations

import math
from numbers import Integral, Real

INT64_MAX = 2**63 - 1  # what a row's integer column holds (Parquet int64)


class ConfigError(ValueError):
    """A config value is invalid; the message names the key and the allowed values."""


def whole_number(value: object, what: str, low: int = 1, high: int = INT64_MAX) -> int:
    """``value`` as an int when it is one (not a bool, not 256.7, not "abc", not null) in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ConfigError(f"{what}={value!r} must be a whole number (from {low} to {high})")
    if not low <= value <= high:
        raise ConfigError(f"{what}={value!r} is out of range: from {low} to {high}")
    return int(value)


def finite_number(value: object, what: str, low: float = -math.inf, high: float = math.inf) -> float:
    """``value`` as a float when it is a finite number (not a bool, not text, not null) in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
        raise ConfigError(f"{what}={value!r} must be a finite number")
    if not low <= float(value) <= high:
        raise ConfigError(f"{what}={value!r} is out of range: from {low:g} to {high:g}")
    return float(value)
