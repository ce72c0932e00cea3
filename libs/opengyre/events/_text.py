"""Strings every store can keep: no NUL character anywhere in an event.

PostgreSQL's text types cannot hold U+0000 while SQLite's can, so one event would apply on one store and be
dead-lettered on the other. The registry refuses it on both sides of the log instead: at encode (the
producer gets a clear error) and at decode (a consumer dead-letters it the same way on every store).
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["ESCAPED_NUL", "nul_path"]

# JSON cannot carry a raw NUL inside a string (msgspec refuses it as malformed); the only way in is this
# escape, so a body without it cannot decode to a string holding NUL. A hit may be a false one ("\\u0000",
# an escaped backslash followed by the text "u0000"): the walk decides.
ESCAPED_NUL = b"\\u0000"


def nul_path(value: Any, path: str = "") -> str | None:
    """Where the first string holding ``\\x00`` sits inside ``value`` (``.field[0]["key"]``), else None."""
    if isinstance(value, str):
        return (path or "<value>") if "\x00" in value else None
    if isinstance(value, msgspec.Struct):
        for name in value.__struct_fields__:
            found = nul_path(getattr(value, name), f"{path}.{name}")
            if found is not None:
                return found
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and "\x00" in key:
                return f"{path}[{key!r}] (the key)"
            found = nul_path(item, f"{path}[{key!r}]")
            if found is not None:
                return found
        return None
    if isinstance(value, list | tuple | set | frozenset):
        for i, item in enumerate(value):
            found = nul_path(item, f"{path}[{i}]")
            if found is not None:
                return found
    return None
