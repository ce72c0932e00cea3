"""Sandboxes for commands the system does not trust: graders, reference solutions, agents' harnesses and tools.

``LocalSandbox`` (or ``open_sandbox``) gives a sandbox of the selected backend: ``namespace`` by default
(bubblewrap: own user/mount/pid/ipc/uts/net/cgroup namespaces, a curated view of the host, loopback-only network
with egress endpoints bridged in), ``none`` only when chosen (limits and a reaper, the host's view), others
registered by name (``register_backend``). See docs/sandbox.md.
"""

from ._backend import (
    DEFAULT_BACKEND,
    ENV_VAR,
    Backend,
    LocalSandbox,
    Sandbox,
    backend_names,
    open_sandbox,
    register_backend,
    selected_backend,
)
from ._base import BaseSandbox, Mount, SandboxError
from ._isolation import network_isolation_available
from ._limits import SandboxLimits, SandboxResult
from ._local import ProcessSandbox, in_namespace_sandbox
from ._namespace import NamespaceSandbox

__all__ = [
    "DEFAULT_BACKEND",
    "ENV_VAR",
    "Backend",
    "BaseSandbox",
    "LocalSandbox",
    "Mount",
    "NamespaceSandbox",
    "ProcessSandbox",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "SandboxResult",
    "backend_names",
    "in_namespace_sandbox",
    "network_isolation_available",
    "open_sandbox",
    "register_backend",
    "selected_backend",
]
