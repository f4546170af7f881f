"""Checking ``--config`` values in apps: one clear line naming the key, never a traceback.

Each checker takes the config dict (defaults filled in), a key, and bounds; it returns the value in the
right type or raises :class:`ConfigError` (a :class:`litz.InputError`, so the user sees only its message).
"""
from __future__ import annotations

import math
from typing import Any

from .errors import InputError


class ConfigError(InputError, ValueError):
    """A bad --config value for an app."""


def bad(key: str, what: str, value: Any) -> ConfigError:
    return ConfigError(f"config {key!r} must be {what}, got {value!r}")


def with_defaults(app: str, config: dict | None, defaults: dict[str, Any]) -> dict[str, Any]:
    """``config`` over ``defaults``; a key the app does not know (a typo) is an error naming the known ones."""
    config = dict(config or {})
    unknown = sorted(set(config) - set(defaults))
    if unknown:
        raise ConfigError(f"unknown config key(s) {', '.join(map(repr, unknown))} for {app} "
                          f"(known: {', '.join(defaults)})")
    return {**defaults, **config}


def integer(v: dict, key: str, low: int) -> int:
    x = v[key]
    if isinstance(x, float) and x.is_integer():
        x = int(x)
    if isinstance(x, bool) or not isinstance(x, int) or x < low:
        raise bad(key, f"an integer >= {low}", x)
    return x


def optional_integer(v: dict, key: str, low: int) -> int | None:
    return None if v[key] is None else integer(v, key, low)


def number(v: dict, key: str, low: float, high: float = math.inf) -> float:
    x = v[key]
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or not low <= x <= high:
        raise bad(key, f"a number in [{low:g}, {high:g}]" if high < math.inf else f"a number >= {low:g}", x)
    return float(x)


def positive(v: dict, key: str) -> float:
    x = v[key]
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0:
        raise bad(key, "a number > 0", x)
    return float(x)


def boolean(v: dict, key: str) -> bool:
    x = v[key]
    if x in (True, False, 0, 1) or x is None:
        return bool(x)
    if isinstance(x, str) and x.lower() in ("true", "false", "yes", "no", "on", "off"):
        return x.lower() in ("true", "yes", "on")
    raise bad(key, "a boolean (0/1)", x)


def path(v: dict, key: str) -> str | None:
    x = v[key]
    if x is None or (isinstance(x, str) and x):
        return x
    raise bad(key, "a file path", x)


def choice(v: dict, key: str, choices: tuple[str, ...]) -> str:
    """One of ``choices`` (lower case), matched without regard to case."""
    x = v[key]
    if isinstance(x, str) and x.lower() in choices:
        return x.lower()
    raise bad(key, "one of " + ", ".join(choices), x)
