"""Who a client is to the NATS server: a user and password, or a NATS credentials file (JWT and nkey)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["NatsCredentials"]


@dataclass(frozen=True, slots=True)
class NatsCredentials:
    """``user`` with ``password``, or ``creds_file`` (a ``.creds`` file, for a server run with JWT accounts)."""

    user: str = ""
    password: str = ""
    creds_file: Path | None = None

    def __post_init__(self) -> None:
        if self.creds_file is not None:
            if self.user or self.password:
                raise ValueError("NATS credentials: a creds file, or a user and password, not both")
        elif not (self.user and self.password):
            raise ValueError("NATS credentials need a user and a password (or a creds file)")

    def connect_options(self) -> dict[str, Any]:
        """nats-py ``connect`` keywords."""
        if self.creds_file is not None:
            return {"user_credentials": str(self.creds_file)}
        return {"user": self.user, "password": self.password}

    def __repr__(self) -> str:  # never a password in a log line or a traceback
        who = str(self.creds_file) if self.creds_file is not None else self.user
        return f"NatsCredentials({who!r})"
