"""Public API only through ``__all__``: every name listed exists, and private modules stay private."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import opengyre

ROOT = Path(__file__).resolve().parents[2]

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


def _module_of(rel: str) -> str:
    """The dotted module a source file is (``opengyre.x._y``), or "" outside the ``opengyre`` tree (a bench)."""
    parts = rel.removesuffix(".py").split("/")
    if "opengyre" not in parts:
        return ""
    mod = parts[parts.index("opengyre") :]
    return ".".join(mod[:-1] if mod[-1] == "__init__" else mod)


def private_imports(root: Path) -> list[str]:
    """Imports of ``opengyre.<pkg>._private`` (at any depth) from a module outside ``<pkg>``, in the code that
    ships and its benchmarks (tests may reach inside what they test)."""
    out: list[str] = []
    sources = [
        *root.glob("libs/opengyre/**/*.py"),
        *root.glob("apps/opengyre/**/*.py"),
        *root.glob("svc-*/**/*.py"),
        *root.glob("bench/**/*.py"),
    ]
    for path in sorted(sources):
        rel = path.relative_to(root).as_posix()
        if "/v1/" in rel:
            continue
        here = _module_of(rel)
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                private = [i for i, p in enumerate(parts) if p.startswith("_") and not p.startswith("__")]
                if parts[0] != "opengyre" or not private:
                    continue
                owner = ".".join(parts[: private[0]])
                if here != owner and not here.startswith(owner + "."):
                    out.append(f"{rel}:{node.lineno}: imports {name}, private to {owner}")
                    break
    return out


def test_no_module_outside_a_package_imports_its_private_modules() -> None:
    assert private_imports(ROOT) == []


def test_a_private_import_from_another_package_is_caught(tmp_path: Path) -> None:
    cli = tmp_path / "svc-proxy" / "opengyre" / "proxy" / "cli.py"
    cli.parent.mkdir(parents=True)
    cli.write_text("from opengyre.cli._common import fail\nfrom opengyre.proxy._store import CALLS\n")
    bench = tmp_path / "bench" / "b.py"
    bench.parent.mkdir()
    bench.write_text("import opengyre.trajectory._tree\nfrom opengyre.trajectory import TrajectoryTree\n")
    assert private_imports(tmp_path) == [
        "bench/b.py:1: imports opengyre.trajectory._tree, private to opengyre.trajectory",
        "svc-proxy/opengyre/proxy/cli.py:1: imports opengyre.cli._common, private to opengyre.cli",
    ]
