"""Backends by name, and which one a sandbox gets.

``namespace`` (the default: bubblewrap namespaces), ``none`` (the process sandbox: limits and a reaper, the host's
view of everything). Another backend (``docker``) registers itself with ``register_backend``. The choice: the
caller's ``backend=`` if given, else ``OPENGYRE_SANDBOX``, else ``namespace``. Nothing falls back silently: where
the chosen backend cannot run, opening the sandbox is a ``SandboxError`` naming the cause; ``none`` runs only when
chosen, and says so (a warning per sandbox). Inside one of our namespace sandboxes a ``namespace`` sandbox is the
process backend (``nested``): bubblewrap cannot nest there, and the outer isolation already holds.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Protocol, runtime_checkable

from ._base import Mount, SandboxError, log
from ._limits import SandboxLimits, SandboxResult
from ._local import ProcessSandbox, in_namespace_sandbox
from ._namespace import NamespaceSandbox

__all__ = [
    "DEFAULT_BACKEND",
    "ENV_VAR",
    "Backend",
    "LocalSandbox",
    "Sandbox",
    "backend_names",
    "get_backend",
    "open_sandbox",
    "register_backend",
    "selected_backend",
]

ENV_VAR = "OPENGYRE_SANDBOX"
DEFAULT_BACKEND = "namespace"


@runtime_checkable
class Sandbox(Protocol):
    """What every backend gives its callers."""

    limits: SandboxLimits
    mounts: tuple[Mount, ...]

    @property
    def root(self) -> Path: ...

    @property
    def isolation(self) -> str: ...

    def open(self) -> Sandbox: ...

    def close(self) -> None: ...

    def inside(self, host_path: str | Path) -> str: ...

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]: ...

    def copy_in(self, src: Path, dest: str) -> Path: ...

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str | Path | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        limits: SandboxLimits | None = None,
    ) -> SandboxResult: ...


Factory = Callable[..., Sandbox]


@dataclass(frozen=True)
class Backend:
    """A backend: ``factory(limits, prefix=..., mounts=..., egress=...)`` makes an unopened sandbox;
    ``check()`` says what it gives on this machine, as lines, and whether it can run (``sandbox check``)."""

    name: str
    factory: Factory
    check: Callable[[], tuple[bool, list[str]]]


_BACKENDS: dict[str, Backend] = {}


def register_backend(backend: Backend) -> None:
    if backend.name in _BACKENDS:
        raise ValueError(f"sandbox backend {backend.name!r} is registered already")
    _BACKENDS[backend.name] = backend


def backend_names() -> list[str]:
    return list(_BACKENDS)


def get_backend(name: str) -> Backend:
    if name not in _BACKENDS:
        raise SandboxError(f"unknown sandbox backend {name!r}; known: {', '.join(_BACKENDS)}")
    return _BACKENDS[name]


def selected_backend(explicit: str | None = None) -> str:
    """The backend a sandbox gets: ``explicit``, else ``$OPENGYRE_SANDBOX``, else the default."""
    name = explicit if explicit is not None else os.environ.get(ENV_VAR, "") or DEFAULT_BACKEND
    get_backend(name)  # an unknown name is an error here, not at the first command
    return name


def _make(
    limits: SandboxLimits | None, prefix: str, mounts: Sequence[Mount], egress: Sequence[str], backend: str | None
) -> Sandbox:
    name = selected_backend(backend)
    if name == "namespace" and in_namespace_sandbox():
        return ProcessSandbox(limits, prefix=prefix, mounts=mounts, egress=egress, nested=True)
    return get_backend(name).factory(limits, prefix=prefix, mounts=mounts, egress=egress)


class LocalSandbox:
    """A sandbox of the selected backend: ``with LocalSandbox(limits) as sb: sb.run(["bash", "x.sh"])``.

    ``backend``: a name (``namespace``, ``none``, ...); None: ``$OPENGYRE_SANDBOX``, else ``namespace``.
    ``mounts``: host paths the command sees (``Mount``); ``egress``: loopback ``host:port`` TCP endpoints the
    command may reach, at the same address inside. ``sb.root`` is the private host directory, seen by the command
    at the same path; ``sb.inside(path)`` translates any host path under it or under a mount."""

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        prefix: str = "og-sandbox-",
        mounts: Sequence[Mount] = (),
        egress: Sequence[str] = (),
        backend: str | None = None,
    ) -> None:
        self._impl = _make(limits, prefix, mounts, egress, backend)
        self._open = False

    @property
    def backend(self) -> Sandbox:
        return self._impl

    @property
    def limits(self) -> SandboxLimits:
        return self._impl.limits

    @property
    def mounts(self) -> tuple[Mount, ...]:
        return self._impl.mounts

    @property
    def root(self) -> Path:
        return self._impl.root

    @property
    def isolation(self) -> str:
        return self._impl.isolation

    def open(self) -> LocalSandbox:
        if self._open:
            return self  # ``with open_sandbox(...) as sb``: opened once
        self._impl.open()
        self._open = True
        if self._impl.isolation == "none":
            log.warning("sandbox %s opened without isolation (backend 'none')", self._impl.root)
        return self

    def close(self) -> None:
        self._open = False
        self._impl.close()

    def __enter__(self) -> LocalSandbox:
        return self.open()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def inside(self, host_path: str | Path) -> str:
        return self._impl.inside(host_path)

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        return self._impl.env(extra)

    def copy_in(self, src: Path, dest: str) -> Path:
        return self._impl.copy_in(src, dest)

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str | Path | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        limits: SandboxLimits | None = None,
    ) -> SandboxResult:
        return self._impl.run(argv, cwd=cwd, env=env, stdin=stdin, limits=limits)


def open_sandbox(
    limits: SandboxLimits | None = None,
    *,
    prefix: str = "og-sandbox-",
    mounts: Sequence[Mount] = (),
    egress: Sequence[str] = (),
    backend: str | None = None,
) -> LocalSandbox:
    """An opened ``LocalSandbox`` (close it, or use it as a context manager)."""
    return LocalSandbox(limits, prefix=prefix, mounts=mounts, egress=egress, backend=backend).open()


def _register_builtins() -> None:
    from ._check import check_namespace, check_none

    register_backend(Backend("namespace", NamespaceSandbox, check_namespace))
    register_backend(Backend("none", ProcessSandbox, check_none))


_register_builtins()
