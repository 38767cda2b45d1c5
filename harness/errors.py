"""Errors the entry point turns into one-line messages (no traceback wall)."""


class ConfigError(ValueError):
    """A config value is invalid; the message names the key and the allowed values."""
