"""The stack's secrets in its data dir: the gRPC bearer token and the NATS users' passwords, each 0600."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

__all__ = ["GRPC_TOKEN_ENV", "ensure_grpc_token", "grpc_token_file", "new_secret", "read_grpc_token", "write_secret"]

# A client that is not handed a token (the scheduler's cell workers, a user's script) takes it from here.
GRPC_TOKEN_ENV = "OPENGYRE_GRPC_TOKEN"
_TOKEN_BYTES = 32


def new_secret() -> str:
    return secrets.token_urlsafe(_TOKEN_BYTES)


def grpc_token_file(data_dir: Path) -> Path:
    return Path(data_dir) / "auth" / "grpc.token"


def write_secret(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` readable by its owner only, unless the file exists (then it is kept: a second
    ``up`` resumes with the same secrets). Whether it wrote. Atomic: never half a file, never two writers'."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        try:
            os.link(tmp, path)  # fails if another writer got there first: its secret stands
        except FileExistsError:
            return False
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def read_grpc_token(data_dir: Path) -> str | None:
    """The data dir's token, None when no stack has written one there yet."""
    try:
        token = grpc_token_file(data_dir).read_text().strip()
    except FileNotFoundError:
        return None
    if not token:
        raise RuntimeError(f"{grpc_token_file(data_dir)} is empty: remove it and `opengyre up` writes a new token")
    return token


def ensure_grpc_token(data_dir: Path) -> str:
    """The data dir's token, created (random, 0600) on first use."""
    token = read_grpc_token(data_dir)
    if token is None:
        write_secret(grpc_token_file(data_dir), new_secret() + "\n")
        token = read_grpc_token(data_dir)
        assert token is not None
    return token
