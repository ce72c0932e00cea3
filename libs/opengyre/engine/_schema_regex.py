"""A JSON Schema as a regular expression over compact JSON text, for constrained decoding on the CPU engine.

SGLang compiles ``json_schema`` with a grammar backend (xgrammar); the CPU engine has none, so it turns the
schemas agents send (objects of typed properties, arrays, enums, ``anyOf``) into a regular expression over
compact JSON (no free whitespace) and decodes under it. Lengths are bounded (strings, arrays, digits) so
that every constrained generation can end: a regular language with finite words. What it cannot express
(``$ref``, ``pattern``, ``not``, ...) is refused, never approximated.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["MAX_ARRAY", "MAX_STRING", "SchemaUnsupported", "schema_regex"]

MAX_STRING = 24  # characters in a string whose schema gives no maxLength
MAX_ARRAY = 4  # items in an array whose schema gives no maxItems
_MAX_DEPTH = 6

_CHAR = r"[ !#-\[\]-~]"  # printable ASCII but '"' and '\' (no escapes: every string ends within its bound)
_INT = r"-?(0|[1-9][0-9]{0,8})"
_NUM = _INT + r"(\.[0-9]{1,6})?"
_BOOL = r"(true|false)"
_NULL = r"null"
_STR = f'"{_CHAR}{{0,{MAX_STRING}}}"'
_SCALAR = f"({_STR}|{_NUM}|{_BOOL}|{_NULL})"
# Keywords that constrain values in ways the expression would not enforce: refused rather than ignored.
_REFUSED = {"$ref", "$defs", "definitions", "pattern", "allOf", "not", "if", "then", "else", "patternProperties",
            "dependentRequired", "dependentSchemas", "prefixItems", "contains", "uniqueItems", "minProperties",
            "maxProperties", "propertyNames", "unevaluatedProperties", "unevaluatedItems", "format", "minimum",
            "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}  # fmt: skip


class SchemaUnsupported(ValueError):
    """A schema keyword the CPU engine's constrained decoding cannot enforce."""


def _literal(value: Any) -> str:
    return re.escape(json.dumps(value, separators=(",", ":"), ensure_ascii=True))


def _alt(parts: list[str]) -> str:
    return "(" + "|".join(parts) + ")" if len(parts) != 1 else parts[0]


def _repeat(item: str, lo: int, hi: int) -> str:
    """``lo``..``hi`` comma-separated ``item``s."""
    if hi == 0:
        return ""
    tail = f"(,{item}){{{max(lo - 1, 0)},{hi - 1}}}"
    return f"{item}{tail}" if lo >= 1 else f"({item}{tail})?"


def schema_regex(schema: Any, depth: int = 0) -> str:
    if depth > _MAX_DEPTH:
        raise SchemaUnsupported(f"the schema nests deeper than {_MAX_DEPTH} levels")
    if schema is True or schema == {}:
        return _SCALAR if depth >= _MAX_DEPTH - 1 else _alt([_SCALAR, _generic_object(depth)])
    if not isinstance(schema, dict):
        raise SchemaUnsupported(f"not a schema: {schema!r}")
    refused = sorted(_REFUSED & set(schema))
    if refused:
        raise SchemaUnsupported(f"schema keyword(s) {', '.join(refused)} are not supported by constrained decoding")
    if "const" in schema:
        return _literal(schema["const"])
    if "enum" in schema:
        return _alt([_literal(v) for v in schema["enum"]])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return _alt([schema_regex(s, depth + 1) for s in schema[key]])
    t = schema.get("type")
    if isinstance(t, list):
        return _alt([schema_regex({**schema, "type": x}, depth) for x in t])
    if t == "string":
        lo = int(schema.get("minLength", 0))
        hi = int(schema.get("maxLength", max(lo, MAX_STRING)))
        return f'"{_CHAR}{{{lo},{hi}}}"'
    if t == "integer":
        return _INT
    if t == "number":
        return _NUM
    if t == "boolean":
        return _BOOL
    if t == "null":
        return _NULL
    if t == "array":
        item = schema_regex(schema.get("items", {}), depth + 1)
        lo = int(schema.get("minItems", 0))
        hi = int(schema.get("maxItems", max(lo, MAX_ARRAY)))
        return r"\[" + _repeat(item, lo, hi) + r"\]"
    if t == "object" or (t is None and "properties" in schema):
        props = schema.get("properties")
        if props is None:
            return _generic_object(depth)
        if not props:
            return r"\{\}"
        required = schema.get("required")
        # Properties in the schema's order; those not required are left out (absent is always valid).
        keys = [k for k in props if required is None or k in required]
        fields = [_literal(k) + ":" + schema_regex(props[k], depth + 1) for k in keys]
        return r"\{" + ",".join(fields) + r"\}"
    if t is None:
        return schema_regex({}, depth)
    raise SchemaUnsupported(f"unknown schema type {t!r}")


def _generic_object(depth: int) -> str:
    """Any flat JSON object (scalar values): what ``{"type": "object"}`` alone asks for."""
    return r"\{" + _repeat(f"{_STR}:{_SCALAR}", 0, MAX_ARRAY) + r"\}"
