"""Sandboxes for commands the system does not trust: graders, reference solutions, agents' tools.

The local process sandbox is the embedded default (temp dir, time and memory limits, no network where the
OS allows); Docker / Harbor environments take its place at scale.
"""

from ._isolation import network_isolation_available
from ._limits import SandboxLimits, SandboxResult
from ._local import LocalSandbox, SandboxError

__all__ = ["LocalSandbox", "SandboxError", "SandboxLimits", "SandboxResult", "network_isolation_available"]
