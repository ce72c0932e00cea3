"""Strings every store can keep: no NUL character in an event's text fields.

PostgreSQL's text types cannot hold U+0000 while SQLite's can, so one event would apply on one store and be
dead-lettered on the other. The registry refuses it on both sides of the log instead: at encode (the
producer gets a clear error) and at decode (a consumer dead-letters it the same way on every store).

What is checked is the text the schema types: ``str`` fields, in lists, dicts and nested structs, at any
depth. Two kinds of field carry foreign bytes that must be kept exactly and are not checked: opaque JSON
payloads (typed ``Any``/``object``, e.g. a model call's conversation context) and fields declared
:data:`RawText` (e.g. tool-call arguments exactly as the engine emitted them). A projection stores those only
serialized (``json.dumps`` writes NUL as the six characters ``\\u0000``), never as a raw text column value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import msgspec
import msgspec.inspect as mi

__all__ = ["ESCAPED_NUL", "RawText", "nul_path"]

# JSON cannot carry a raw NUL inside a string (msgspec refuses it as malformed); the only way in is this
# escape, so a body without it cannot decode to a string holding NUL. A hit may be a false one ("\\u0000",
# an escaped backslash followed by the text "u0000", or a NUL inside a payload that is not checked): the
# walk decides.
ESCAPED_NUL = b"\\u0000"

_RAW = "opengyre-raw-text"
RawText = Annotated[str, msgspec.Meta(extra={_RAW: True})]
"""Text kept byte for byte as a foreign source produced it (NUL included); store it serialized only."""

# value, path -> the path of the first string holding NUL, or None
_Check = Callable[[Any, str], str | None]


def _check_str(value: Any, path: str) -> str | None:
    return (path or "<value>") if isinstance(value, str) and "\x00" in value else None


_plans: dict[type, list[tuple[str, _Check]]] = {}


def _plan(cls: type) -> list[tuple[str, _Check]]:
    """The checked fields of a struct class (built once; a placeholder first, for self-referencing types)."""
    plan = _plans.get(cls)
    if plan is None:
        plan = _plans[cls] = []
        info = mi.type_info(cls)
        assert isinstance(info, mi.StructType)
        for f in info.fields:
            check = _checker(f.type)
            if check is not None:
                plan.append((f.name, check))
    return plan


def _check_struct(value: Any, path: str) -> str | None:
    if not isinstance(value, msgspec.Struct):
        return None
    for name, check in _plan(type(value)):
        found = check(getattr(value, name), f"{path}.{name}")
        if found is not None:
            return found
    return None


def _checker(t: mi.Type) -> _Check | None:
    """How to look for NUL in a value of type ``t``; None when no text of it is checked."""
    if isinstance(t, mi.StrType):
        return _check_str
    if isinstance(t, mi.Metadata):
        return None if (t.extra or {}).get(_RAW) else _checker(t.type)
    if isinstance(t, mi.StructType):
        return _check_struct
    if isinstance(t, mi.UnionType):
        checks = [c for c in map(_checker, t.types) if c is not None]
        if not checks:
            return None

        def check_union(value: Any, path: str) -> str | None:
            for c in checks:
                found = c(value, path)
                if found is not None:
                    return found
            return None

        return check_union
    if isinstance(t, mi.ListType | mi.VarTupleType | mi.SetType | mi.FrozenSetType):
        item = _checker(t.item_type)
        if item is None:
            return None

        def check_items(value: Any, path: str) -> str | None:
            if isinstance(value, list | tuple | set | frozenset):
                for i, v in enumerate(value):
                    found = item(v, f"{path}[{i}]")
                    if found is not None:
                        return found
            return None

        return check_items
    if isinstance(t, mi.DictType):
        if isinstance(t.value_type, mi.AnyType | mi.CustomType):
            return None  # an opaque JSON document: kept whole, stored serialized
        key, val = _checker(t.key_type), _checker(t.value_type)

        def check_dict(value: Any, path: str) -> str | None:
            if not isinstance(value, dict):
                return None
            for k, v in value.items():
                if key is not None and key(k, "") is not None:
                    return f"{path}[{k!r}] (the key)"
                found = val(v, f"{path}[{k!r}]") if val is not None else None
                if found is not None:
                    return found
            return None

        return check_dict
    # Numbers, times, bytes, literals (fixed in code), and Any/object payloads: nothing to check.
    return None


def nul_path(event: msgspec.Struct) -> str | None:
    """Where the first checked string holding ``\\x00`` sits in ``event`` (``.field[0]["key"]``), else None."""
    return _check_struct(event, "")
