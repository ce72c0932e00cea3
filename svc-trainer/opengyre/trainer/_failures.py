"""Failure classes: infrastructure noise is told apart from model capability before anything is trained.

Exit 137 is a SIGKILL (the OOM killer or a memory limit), 124 is ``timeout(1)``'s code; sandbox start-up and
network errors are matched in the output. Infrastructure failures are masked, never trained as negatives.
"""

from __future__ import annotations

import re

from opengyre.events import FailureClass

__all__ = ["INFRA_CLASSES", "TRANSIENT_CLASSES", "classify_failure"]

# No valid learning signal at all: the execution is replaced by nothing (masked).
INFRA_CLASSES: frozenset[FailureClass] = frozenset({"oom", "sandbox", "engine"})
# Recoverable hiccups (a tool call timed out, the network stalled): filtered, behind a circuit breaker.
TRANSIENT_CLASSES: frozenset[FailureClass] = frozenset({"timeout", "network"})

_NETWORK = re.compile(
    r"(connection (refused|reset|timed out)|temporary failure in name resolution|network is unreachable|"
    r"could not resolve host|name or service not known|no route to host)",
    re.IGNORECASE,
)
_SANDBOX = re.compile(
    r"(sandbox (unavailable|failed|error)|failed to start (container|sandbox)|env(ironment)? (init|reset) failed|"
    r"no such container|cannot connect to the docker daemon)",
    re.IGNORECASE,
)
_OOM = re.compile(r"(out of memory|oom-?kill|cannot allocate memory|memoryerror)", re.IGNORECASE)


def classify_failure(exit_code: int | None, output: str = "") -> FailureClass | None:
    """The failure class of a process outcome, or None when nothing points at infrastructure."""
    if exit_code == 137 or _OOM.search(output):
        return "oom"
    if exit_code == 124:
        return "timeout"
    if _SANDBOX.search(output):
        return "sandbox"
    if _NETWORK.search(output):
        return "network"
    return None
