"""Per-execution API keys: ``og1.<execution_id>.<role>.<hmac>``, checked without any lookup.

A harness needs only a base URL and a key. The key names its execution (so another execution's key is
refused) and carries the caller's role (main, sub-agent, ...) for harnesses that cannot set a header.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

from opengyre.events import TrajectoryRole, subject_token

__all__ = ["ROLES", "ExecutionKeys", "KeyClaim", "derive_key", "load_or_create_secret"]

ROLES: tuple[str, ...] = get_args(TrajectoryRole)


@dataclass(frozen=True, slots=True)
class KeyClaim:
    execution_id: str
    role: TrajectoryRole


class ExecutionKeys:
    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("the key secret must be at least 16 bytes")
        self._secret = secret

    def _sig(self, execution_id: str, role: str) -> str:
        return hmac.new(self._secret, f"{execution_id}.{role}".encode(), hashlib.sha256).hexdigest()[:32]

    def issue(self, execution_id: str, role: TrajectoryRole = "main") -> str:
        subject_token(execution_id)  # the id names an event subject: same rules
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; known: {', '.join(ROLES)}")
        return f"og1.{execution_id}.{role}.{self._sig(execution_id, role)}"

    def verify(self, key: str) -> KeyClaim | None:
        parts = key.split(".")
        if len(parts) != 4 or parts[0] != "og1" or parts[2] not in ROLES:
            return None
        if not hmac.compare_digest(parts[3], self._sig(parts[1], parts[2])):
            return None
        return KeyClaim(parts[1], parts[2])  # type: ignore[arg-type]


def derive_key(secret: bytes, purpose: str) -> bytes:
    """A key for one purpose from the proxy's secret (HMAC-SHA256 keyed by the secret over the purpose's name):
    what one purpose's key reveals or signs says nothing of the secret or of another purpose's key."""
    return hmac.new(secret, f"opengyre-proxy/{purpose}".encode(), hashlib.sha256).digest()


def load_or_create_secret(path: Path) -> bytes:
    """The proxy's key secret, kept in the data dir so issued keys survive restarts (0600, its folder 0700 when
    this makes it)."""
    if path.exists():
        return bytes.fromhex(path.read_text().strip())
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    secret = secrets.token_bytes(32)
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    # Created 0600 (never readable by others, not even between the write and a chmod).
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write(secret.hex() + "\n")
    tmp.replace(path)
    return secret
