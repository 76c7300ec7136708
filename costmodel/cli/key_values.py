"""``key=value`` arguments of the small module CLIs (``python -m costmodel.collectives``,
``python -m costmodel.colocation``): each command allows a set of keys; anything else stops
with one line naming the allowed keys and the usage."""

from __future__ import annotations

from typing import Mapping


def parse_key_values(cmd: str, argv: list[str], allowed: Mapping[str, set[str]], usage: str) -> dict[str, str]:
    """``argv`` of ``cmd`` as a dict; a bare word or a key not in ``allowed[cmd]`` is refused."""
    out = {}
    for arg in argv:
        key, eq, value = arg.partition("=")
        if not eq or key not in allowed[cmd]:
            raise SystemExit(f"{cmd}: arguments are key=value with key in {sorted(allowed[cmd])}, got {arg!r}\n{usage}")
        out[key] = value
    return out


def int_arg(args: Mapping[str, str], key: str, default: int | None) -> int | None:
    """``args[key]`` as an integer (``default`` when absent); not an integer: one line naming the key."""
    if key not in args:
        return default
    try:
        return int(args[key])
    except ValueError:
        raise SystemExit(f"{key} must be an integer, got {args[key]!r}") from None
