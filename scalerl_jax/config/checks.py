"""What every config section's validation uses: ConfigError and the checks that raise it with
a sentence naming the section, the field and the offending value."""

from __future__ import annotations

from typing import Any

from scalerl_jax.errors import UserError


class ConfigError(UserError, ValueError):
    """A configuration value is invalid. The message names the field and the value."""


def _check(cond: bool, cls: str, field: str, value: Any, why: str) -> None:
    if not cond:
        raise ConfigError(f"{cls}.{field}={value!r}: {why}")


def _positive(cls: str, **fields: Any) -> None:
    for name, value in fields.items():
        _check(value is not None and value > 0, cls, name, value, "must be > 0")


def _choice(cls: str, field: str, value: Any, options: tuple) -> None:
    _check(value in options, cls, field, value, f"must be one of {options}")
