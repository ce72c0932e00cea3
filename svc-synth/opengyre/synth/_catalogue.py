"""The registered patterns, looked up by id. Importing this module imports every pattern module (``_patterns``),
so a lookup never sees a half-filled registry, and ``_pattern``, which the pattern modules import, does not
import them back (it did, lazily: an import circle hidden from the import graph)."""

from __future__ import annotations

from . import _patterns  # noqa: F401  (registers every pattern module)
from ._pattern import Dimension, Pattern, registered

__all__ = ["get_pattern", "pattern_ids"]


def get_pattern(pattern_id: str) -> Pattern:
    try:
        return registered()[pattern_id]
    except KeyError:
        raise KeyError(f"unknown pattern {pattern_id!r}") from None


def pattern_ids(dimension: Dimension | None = None) -> list[str]:
    return sorted(k for k, p in registered().items() if dimension is None or p.dimension == dimension)
