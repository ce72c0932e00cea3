"""Public API only through ``__all__``: every name listed exists, and private modules stay private."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import opengyre

PACKAGES = sorted(
    m.name
    for m in pkgutil.walk_packages(opengyre.__path__, "opengyre.")
    if m.ispkg and ".v1" not in m.name and "migrations" not in m.name and not m.name.rsplit(".", 1)[-1].startswith("_")
)


def test_the_kernel_and_every_service_are_packages() -> None:
    for name in ("events", "eventlog", "projection", "store", "config", "runtime", "cli", "models", "trajectory"):
        assert f"opengyre.{name}" in PACKAGES
    for name in ("synth", "scheduler", "proxy", "trainer", "bench"):
        assert f"opengyre.{name}" in PACKAGES


@pytest.mark.parametrize("name", PACKAGES)
def test_all_names_exist(name: str) -> None:
    mod = importlib.import_module(name)
    exported = getattr(mod, "__all__", None)
    assert exported is not None, f"{name} has no __all__"
    missing = [n for n in exported if not hasattr(mod, n)]
    assert not missing, f"{name}.__all__ lists missing names {missing}"
    assert len(exported) == len(set(exported))
