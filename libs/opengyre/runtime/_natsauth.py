"""Users and subject permissions of the embedded nats-server, generated from the event catalogue.

Without them any local process could append an event, a ``cell-engine-changed`` pointing the proxy at its own
engine, say. Each service gets a user that may publish only the subjects of the aggregates whose events it owns
(``Event.owner``), plus what JetStream's client side needs (its API for consumers and stream info, acks, flow
control, the blob bucket, the payload stream for those that use it) and may subscribe only to reply inboxes; the
``admin`` user (``opengyre up``, the CLI) may do anything. A connection without credentials is refused.

NATS permissions are per subject, and a subject is per aggregate (``<prefix>.<aggregate>.<id>``), except for an
aggregate whose events have several owners (``execution``: scheduler, proxy, trainer): its subjects end with the
event's type (``<prefix>.execution.<id>.model-call-recorded``), so each owner may publish only its own types.

Passwords are random, written 0600 under ``<data dir>/auth/nats/`` once and reused; the server's config
(``<data dir>/auth/nats-server.conf``, 0600 too) is written again from the catalogue at each start, so it
cannot drift from the code.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..config import installed_services, new_secret, write_secret
from ..eventlog import LogConfig, NatsCredentials
from ..events import EventRegistry, ModelCallRecorded, PayloadsCompacted, default_registry

__all__ = [
    "NATS_ADMIN",
    "NATS_CREDS_ENV",
    "NATS_PASSWORD_ENV",
    "NATS_USER_ENV",
    "client_credentials",
    "ensure_nats_users",
    "env_credentials",
    "nats_config_file",
    "nats_permissions",
    "read_nats_credentials",
    "write_nats_config",
]

NATS_ADMIN = "admin"
# How a process is told who it is to NATS: the supervisor sets these for each service it starts; with an external
# --nats-url the user sets them (or a creds file) for `opengyre up` and every command.
NATS_USER_ENV = "OPENGYRE_NATS_USER"
NATS_PASSWORD_ENV = "OPENGYRE_NATS_PASSWORD"
NATS_CREDS_ENV = "OPENGYRE_NATS_CREDS"

_INBOX = "_INBOX.>"


def _jetstream_client(log: LogConfig) -> list[str]:
    """What any reader needs to publish: JetStream API reads and consumers, acks, flow control, the blob bucket."""
    obj = f"OBJ_{log.blob_bucket}"
    return [
        "$JS.API.INFO",
        "$JS.API.STREAM.INFO.*",
        "$JS.API.STREAM.NAMES",
        "$JS.API.STREAM.LIST",
        "$JS.API.STREAM.MSG.GET.*",
        "$JS.API.DIRECT.GET.>",
        "$JS.API.CONSUMER.>",
        "$JS.ACK.>",
        "$JS.FC.>",
        # Bodies too large for a message go to the object store (any service's event may be one).
        f"$O.{log.blob_bucket}.>",
        f"$JS.API.STREAM.CREATE.{obj}",
        f"$JS.API.STREAM.PURGE.{obj}",
        # Every payload reader makes sure the payload stream exists with the configured limits.
        f"$JS.API.STREAM.CREATE.{log.payloads}",
        f"$JS.API.STREAM.UPDATE.{log.payloads}",
    ]


def nats_permissions(
    log: LogConfig, registry: EventRegistry | None = None, services: Iterable[str] | None = None
) -> dict[str, dict[str, Any]]:
    """Each user's ``permissions`` block of the nats-server config: a user per service (default: every one the
    runtime knows), and ``admin``."""
    reg = registry or default_registry()
    types = reg.types().values()
    shared = reg.shared_aggregates()
    names = list(installed_services() if services is None else services)
    unknown = sorted({cls.owner for cls in types} - set(names))
    if unknown:
        raise ValueError(f"events are owned by {', '.join(unknown)}, which is no service of {', '.join(names)}")
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        aggregates = sorted({cls.aggregate for cls in types if cls.owner == name and cls.aggregate not in shared})
        publish = [log.aggregate_filter(a) for a in aggregates]
        # A shared aggregate's subjects end with the event's type: each owner may publish its own types only.
        publish += sorted(
            log.subject(cls.aggregate, "*", cls.type_name())
            for cls in types
            if cls.owner == name and cls.aggregate in shared
        )
        publish += _jetstream_client(log)
        if ModelCallRecorded.owner == name:  # the recorder writes the token payloads its events refer to
            publish.append(f"{log.payloads}.>")
        if PayloadsCompacted.owner == name:  # retention deletes what it compacted
            publish.append(f"$JS.API.STREAM.PURGE.{log.payloads}")
        out[name] = {"publish": {"allow": publish}, "subscribe": {"allow": [_INBOX]}}
    out[NATS_ADMIN] = {"publish": {"allow": [">"]}, "subscribe": {"allow": [">"]}}
    return out


def _creds_file(data_dir: Path, user: str) -> Path:
    return Path(data_dir) / "auth" / "nats" / f"{user}.json"


def nats_config_file(data_dir: Path) -> Path:
    return Path(data_dir) / "auth" / "nats-server.conf"


def read_nats_credentials(data_dir: Path, user: str) -> NatsCredentials | None:
    """``user``'s credentials for the data dir's embedded server, None when none were written."""
    path = _creds_file(data_dir, user)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"cannot read the NATS credentials in {path}: {exc}") from exc
    try:
        return NatsCredentials(user=str(data["user"]), password=str(data["password"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise RuntimeError(f"{path} holds no NATS user and password: remove it to have a new one written") from exc


def ensure_nats_users(data_dir: Path, users: Iterable[str]) -> dict[str, NatsCredentials]:
    """Each user's credentials, a random password written (0600) for those that have none yet."""
    out: dict[str, NatsCredentials] = {}
    for user in users:
        creds = read_nats_credentials(data_dir, user)
        if creds is None:
            write_secret(_creds_file(data_dir, user), json.dumps({"user": user, "password": new_secret()}) + "\n")
            creds = read_nats_credentials(data_dir, user)
            assert creds is not None
        out[user] = creds
    return out


def write_nats_config(data_dir: Path, log: LogConfig, registry: EventRegistry | None = None) -> Path:
    """The embedded nats-server's config (users, passwords, permissions), written again from the catalogue;
    its path (pass it to ``EmbeddedNats``)."""
    perms = nats_permissions(log, registry)
    creds = ensure_nats_users(data_dir, perms)
    users = [{"user": u, "password": creds[u].password, "permissions": perms[u]} for u in perms]
    # nats-server reads JSON as its config syntax; quoted strings are never variables.
    text = json.dumps({"authorization": {"users": users}}, indent=2) + "\n"
    path = nats_config_file(data_dir)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    tmp.replace(path)
    return path


def env_credentials(env: Mapping[str, str] | None = None) -> NatsCredentials | None:
    """The credentials the environment names (``OPENGYRE_NATS_USER`` and ``OPENGYRE_NATS_PASSWORD``, or
    ``OPENGYRE_NATS_CREDS``: a NATS creds file), None when it names none."""
    env = os.environ if env is None else env
    user, password, creds = (env.get(k, "").strip() for k in (NATS_USER_ENV, NATS_PASSWORD_ENV, NATS_CREDS_ENV))
    if creds:
        if user or password:
            raise ValueError(f"{NATS_CREDS_ENV} and {NATS_USER_ENV}/{NATS_PASSWORD_ENV} are both set: set one")
        return NatsCredentials(creds_file=Path(creds))
    if user or password:
        if not (user and password):
            raise ValueError(f"{NATS_USER_ENV} and {NATS_PASSWORD_ENV} go together: one is set, not the other")
        return NatsCredentials(user=user, password=password)
    return None


def client_credentials(data_dir: Path, *, embedded: bool) -> NatsCredentials | None:
    """What a command connects with: the admin user of the data dir's embedded server (None: it has none yet,
    a store from before users), else, with --nats-url, what the environment names."""
    if embedded:
        return read_nats_credentials(data_dir, NATS_ADMIN)
    return env_credentials()
