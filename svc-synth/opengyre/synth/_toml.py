"""A small TOML writer for task.toml (strings, numbers, booleans, lists of those, nested tables)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["dumps_toml"]


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def dumps_toml(doc: Mapping[str, Any]) -> str:
    lines = [f"{k} = {_value(v)}" for k, v in doc.items() if not isinstance(v, Mapping)]
    for k, v in doc.items():
        if isinstance(v, Mapping):
            lines.append(f"\n[{k}]")
            lines += [f"{json.dumps(str(kk))} = {_value(vv)}" for kk, vv in v.items()]
    return "\n".join(lines) + "\n"
