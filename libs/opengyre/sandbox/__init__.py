"""Sandboxes for commands the system does not trust: graders, reference solutions, agents' tools.

The local process sandbox is the embedded default (temp dir, time and memory limits, no network where the
OS allows); Docker / Harbor environments take its place at scale.
"""

from ._docker import BASE_IMAGE, DockerSandbox, Mount, docker_unavailable
from ._docker_image import DockerfileError, ImageBuild, build_image, check_dockerfile
from ._isolation import network_isolation_available
from ._limits import SandboxLimits, SandboxResult
from ._local import LocalSandbox, SandboxError

__all__ = [
    "BASE_IMAGE",
    "DockerSandbox",
    "DockerfileError",
    "ImageBuild",
    "LocalSandbox",
    "Mount",
    "SandboxError",
    "SandboxLimits",
    "SandboxResult",
    "build_image",
    "check_dockerfile",
    "docker_unavailable",
    "network_isolation_available",
]
