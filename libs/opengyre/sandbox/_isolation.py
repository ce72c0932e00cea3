"""Network isolation through an unprivileged user + network namespace (``unshare -rn``), where allowed.

Probed once per process: containers and hardened kernels often forbid unprivileged user namespaces, and then
commands run with the host's network (the result says so; callers that require isolation can refuse).
"""

from __future__ import annotations

import shutil
import subprocess
from functools import lru_cache

__all__ = ["network_isolation_available", "no_network_prefix"]


@lru_cache(maxsize=1)
def network_isolation_available() -> bool:
    exe = shutil.which("unshare")
    if exe is None:
        return False
    try:
        probe = subprocess.run(
            [exe, "--user", "--map-root-user", "--net", "--", "true"], capture_output=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0


def no_network_prefix() -> list[str]:
    """argv prefix that runs a command in a fresh network namespace (only a down loopback), or [] if impossible."""
    if not network_isolation_available():
        return []
    exe = shutil.which("unshare")
    assert exe is not None
    return [exe, "--user", "--map-root-user", "--net", "--"]
