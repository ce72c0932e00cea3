"""The scheduler package as an earlier commit had it, loaded into this process beside today's, so a speed
figure is a ratio against a baseline run in the same process (same interpreter, same load, alternating runs).

The commit's ``svc-scheduler/opengyre/scheduler`` is extracted with ``git archive`` and imported under another
name; its imports are relative (``opengyre.events`` etc. are today's, which it shares). Its SQL tables are
declared on a throwaway declarative base, so they do not collide with today's.
"""

from __future__ import annotations

import importlib
import importlib.util
import io
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from types import ModuleType

from sqlalchemy.orm import DeclarativeBase

import opengyre.scheduler  # today's first: its tables own the shared metadata
import opengyre.store

PACKAGE = "svc-scheduler/opengyre/scheduler"


def load_baseline(ref: str, name: str = "_baseline_scheduler") -> tuple[ModuleType, ModuleType, ModuleType]:
    """(package, its ``sim``, its ``policies``) as of git ``ref``."""
    root = Path(__file__).resolve().parents[2]
    tar = subprocess.run(["git", "-C", str(root), "archive", ref, PACKAGE], check=True, capture_output=True).stdout
    where = Path(tempfile.mkdtemp(prefix="sched-baseline-"))
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(where, filter="data")
    pkg = where / PACKAGE
    spec = importlib.util.spec_from_file_location(name, pkg / "__init__.py", submodule_search_locations=[str(pkg)])
    assert spec is not None and spec.loader is not None

    class _Throwaway(DeclarativeBase):
        pass

    shared = opengyre.store.Base
    opengyre.store.Base = _Throwaway  # type: ignore[misc,assignment]
    try:
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    finally:
        opengyre.store.Base = shared  # type: ignore[misc]
    assert opengyre.scheduler is not module
    return module, importlib.import_module(f"{name}.sim"), importlib.import_module(f"{name}.policies")
