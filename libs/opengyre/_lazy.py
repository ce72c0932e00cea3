"""Lazy public names for packages: the CLI imports every ``opengyre.<svc>`` on each command and must not pay for
torch or transformers until a command actually uses them; a process that needs one piece of a kernel package
(the engine: ``opengyre.runtime.spawn``) must not pay for the rest (bench/import_cost.py measures it)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` resolving ``name`` from ``package + "." + where[name]`` on first use (or from
    ``where[name]`` itself when it is absolute, ``opengyre.x``: a name re-exported from a shared package)."""
    import sys

    def __getattr__(name: str) -> Any:  # noqa: N807 (module __getattr__)
        mod = where.get(name)
        if mod is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        target = mod if mod.startswith("opengyre.") else f"{package}.{mod}"
        value = getattr(importlib.import_module(target), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
