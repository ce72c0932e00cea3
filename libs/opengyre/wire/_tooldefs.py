"""Tool definitions checked as each dialect checks them: the name's pattern, names unique within the request (a
model's call of a name two tools share could not be told apart), and a JSON Schema that is one.

A harness that sends a broken tool gets the dialect's 400 and nothing is recorded, rather than a trajectory
whose tool list no real API would have accepted.
"""

from __future__ import annotations

import re
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError

from ._errors import ApiError

__all__ = ["ANTHROPIC_NAME", "OPENAI_NAME", "check_schema", "check_tool_name"]

OPENAI_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI's function-name rule
ANTHROPIC_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")  # Anthropic's tools.N.name pattern


def check_tool_name(name: object, pattern: re.Pattern[str], where: str, seen: dict[str, str]) -> str:
    """``name`` if it matches ``pattern`` and no earlier tool of the request has it (``seen``: name -> where,
    filled in here)."""
    if not isinstance(name, str) or pattern.fullmatch(name) is None:
        raise ApiError.invalid(f"{where}: {name!r} does not match pattern '{pattern.pattern}'", param=where)
    if name in seen:
        raise ApiError.invalid(f"{where}: tool names must be unique; {name!r} is also {seen[name]}", param=where)
    seen[name] = where
    return name


def check_schema(schema: object, where: str, *, require_object: bool) -> dict[str, Any]:
    """``schema`` if it is a JSON Schema (checked against its draft's meta-schema; 2020-12 when undeclared)."""
    if not isinstance(schema, dict):
        raise ApiError.invalid(f"{where}: must be a JSON Schema object, got {type(schema).__name__}", param=where)
    try:
        jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
    except SchemaError as exc:
        path = "/".join(str(p) for p in exc.path)
        raise ApiError.invalid(
            f"{where}: not a valid JSON Schema ({exc.message}{f' at {path}' if path else ''})", param=where
        ) from None
    if require_object and schema.get("type") != "object":
        raise ApiError.invalid(f"{where}.type: must be 'object'", param=f"{where}.type")
    return schema
