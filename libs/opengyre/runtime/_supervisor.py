"""The embedded stack: nats-server (unless a URL is given), migrations, one process per service, restarts.

One stack per data dir: the supervisor holds the data dir's lock (``_lock``) for its whole life, taken before
anything starts. Its children die with it (parent-death signal, ``_procs``); what a stack that died anyway left
behind (pids in ``stack.json`` and the store's pid file, checked to be ours) is stopped before a new one starts.
The supervisor restarts a crashed service and a crashed nats-server (same port, same store), and restarts a
nats-server whose store failed a write (a full disk) once space is free again. With ``nats_cluster`` the log is a
JetStream cluster of 3 or 5 nats-servers (``NatsCluster``): each member is kept up the same way, on its own.

A full disk stops nothing: a record the supervisor cannot write (``stack.json``) is written again, with backoff,
until it goes through, and a service that exits while the data dir's disk is full is restarted, without counting
towards its restart limit, once there is room again (``log_min_free_mb``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine

from ..config import PROXY_HTTP, Settings, ensure_grpc_token
from ..eventlog import EventLog, HealthProbe, LogHealth, NatsCredentials
from ..retry import backoff
from ..store import create_db_engine, migrate
from ._cluster import NatsCluster
from ._lock import DataDirLock
from ._nats import EmbeddedNats, is_nats_server_of
from ._natsauth import (
    NATS_ADMIN,
    NATS_CREDS_ENV,
    NATS_PASSWORD_ENV,
    NATS_USER_ENV,
    ensure_nats_users,
    env_credentials,
    write_nats_config,
)
from ._ports import port_is_free
from ._procs import cmdline, spawn, stop_group
from ._ready import ExitedBeforeReady, wait_ready
from ._service import SERVICE_CLASSES, SERVICE_NEEDS

__all__ = [
    "Leftover",
    "PortTaken",
    "ServiceFailed",
    "Stack",
    "find_leftovers",
    "lock_holder",
    "read_stack_file",
    "reap_leftovers",
    "stack_alive",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
STABLE_AFTER_S = 60.0
NATS_STORE = "nats"
NATS_CLUSTER_STORE = "nats-cluster"  # n0, n1, ... below it: a cluster's members (not the one server's store)


class PortTaken(RuntimeError):
    """A port the user asked for is in use."""


def read_stack_file(settings: Settings) -> dict[str, Any] | None:
    try:
        data = json.loads(settings.stack_file.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    _write_text(path, json.dumps(data, indent=2) + "\n")


# What a write to a full (or over-quota) disk raises: worth waiting out, never a reason to stop the stack.
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_no_space(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in NO_SPACE


def lock_holder(settings: Settings) -> dict[str, Any] | None:
    """Who holds the data dir now (``role`` "up": a stack's supervisor), or None."""
    if not settings.data_dir.is_dir():
        return None
    return DataDirLock(settings.data_dir).holder()


def stack_alive(settings: Settings) -> dict[str, Any] | None:
    """The running stack's record, when a supervisor holds the data dir and has finished starting."""
    holder = lock_holder(settings)
    if not holder or holder.get("role") != "up":
        return None
    data = read_stack_file(settings)
    if data is None or int(data.get("pid", 0)) != int(holder.get("pid", -1)):
        return None  # still starting
    return data


@dataclass(frozen=True)
class Leftover:
    what: str
    pid: int

    def __str__(self) -> str:
        return f"{self.what} (pid {self.pid})"


def is_service_of(pid: int, name: str, data_dir: Path) -> bool:
    """Whether ``pid`` is service ``name`` of the stack on ``data_dir`` now (not a process that reuses the pid)."""
    argv = cmdline(pid) or []
    want = ["opengyre.cli", "service", "run", name]
    joined = "\0".join(argv)
    return "\0".join(want) in joined and f"--data-dir\0{data_dir.resolve()}" in joined


def find_leftovers(settings: Settings) -> list[Leftover]:
    """Processes a stack on this data dir left running when its supervisor died (call without the lock held
    by a live supervisor): the recorded pids that are still ours, not whatever reuses them now."""
    found: dict[int, Leftover] = {}
    store = settings.data_dir / NATS_STORE
    for each in [store, *sorted((settings.data_dir / NATS_CLUSTER_STORE).glob("n*"))]:
        with contextlib.suppress(OSError, ValueError):
            pid = int((each / "nats-server.pid").read_text().strip())
            if is_nats_server_of(pid, each):
                found[pid] = Leftover("nats-server", pid)
    data = read_stack_file(settings) or {}
    pid = int(data.get("nats_pid") or 0)
    if pid and pid not in found and is_nats_server_of(pid, store):
        found[pid] = Leftover("nats-server", pid)
    for node in data.get("nats_nodes") or []:
        pid, where = int(node.get("pid") or 0), settings.data_dir / NATS_CLUSTER_STORE / str(node.get("name", ""))
        if pid and pid not in found and is_nats_server_of(pid, where):
            found[pid] = Leftover("nats-server", pid)
    for name, info in (data.get("services") or {}).items():
        pid = int(info.get("pid") or 0)
        if pid and is_service_of(pid, name, settings.data_dir):
            found[pid] = Leftover(f"svc-{name}", pid)
    # Services first: they drain into the log before it goes.
    return sorted(found.values(), key=lambda x: x.what == "nats-server")


def reap_leftovers(settings: Settings) -> list[Leftover]:
    """Stop what ``find_leftovers`` finds (their process groups: SIGTERM, then SIGKILL); what it stopped."""
    stopped = []
    for item in find_leftovers(settings):
        log.warning("stopping %s left by a stack that died on %s", item, settings.data_dir)
        if not stop_group(item.pid):
            raise RuntimeError(f"cannot stop {item} left by a previous stack on {settings.data_dir}")
        stopped.append(item)
    return stopped


class ServiceFailed(RuntimeError):
    """A service reached its restart limit (it kept exiting, with the same error): restarting it again would not
    help. The message names it and quotes its log's last line."""


@dataclass
class _Child:
    name: str
    port: int  # the one wanted until ``bound``, then the one the service reported
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: float = 0.0
    bound: bool = False
    last_error: str = ""  # its log's last line when it last exited by itself
    waiting_for_space: bool = False  # exited while the disk was full: restarted once it has room


def _last_line(path: Path) -> str:
    """The last non-empty line of a service's log (an exception's message ends its traceback), cut to 300."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 8192))
            tail = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


@dataclass
class _LogWatch:
    """The supervisor's view of its nats-server: restarts, and health as /healthz reports it."""

    health: LogHealth = field(default_factory=lambda: LogHealth(True, ""))
    restarts: int = 0
    started_at: float = 0.0
    failed_checks: int = 0
    exited_at: float = 0.0
    quick: int = 0  # exits soon after a start, in a row
    next_try: float = 0.0
    waiting_for_space: bool = False


@dataclass
class Stack:
    """Start with ``start()``, supervise with ``supervise(stop)``, end with ``stop()``."""

    settings: Settings
    services: list[str] = field(default_factory=lambda: list(SERVICE_CLASSES))
    max_restarts: int = 5
    nats: EmbeddedNats | None = None
    cluster: NatsCluster | None = None  # the embedded log as a cluster (``Settings.nats_cluster``), else None
    nats_url: str = ""
    children: dict[str, _Child] = field(default_factory=dict)
    engines: dict[str, Engine] = field(default_factory=dict)
    reaped: list[Leftover] = field(default_factory=list)
    health_every: float = 1.0
    gave_up: ServiceFailed | None = None  # the first service that reached its restart limit
    _given_up: asyncio.Event = field(default_factory=asyncio.Event)  # set with ``gave_up``: what ``watch`` awaits
    # Extra environment for the services (a run's scheduler policy, the hardening knobs): over this process's own.
    env: dict[str, str] = field(default_factory=dict)
    _lock: DataDirLock | None = None
    _log: _LogWatch = field(default_factory=_LogWatch)
    # One client per nats-server for every /healthz check: a client per check built an SSL context each second
    # (HealthProbe); keyed by monitoring URL (a restarted nats-server keeps its ports).
    _probes: dict[str, HealthProbe] = field(default_factory=dict)
    _members: dict[str, _LogWatch] = field(default_factory=dict)  # a cluster's members' watches, by name
    # Writing stack.json again after a full disk refused it (see ``_write_stack_file``).
    _rewrite: asyncio.Task[None] | None = None
    stack_file_failures: int = 0  # writes of stack.json the disk refused (each retried until one goes through)
    # Who each process is to NATS: the embedded server's users (``_natsauth``), or, with --nats-url, what the
    # environment names (``env_credentials``) for every one of them.
    nats_users: dict[str, NatsCredentials] = field(default_factory=dict)

    @property
    def embedded(self) -> bool:
        """Whether this stack runs its log (one server or a cluster), rather than joining ``--nats-url``."""
        return self.nats is not None or self.cluster is not None

    @property
    def servers(self) -> list[EmbeddedNats]:
        """The nats-servers this stack runs: none, its one, or its cluster's members."""
        if self.cluster is not None:
            return self.cluster.nodes
        return [self.nats] if self.nats is not None else []

    @property
    def admin_credentials(self) -> NatsCredentials | None:
        """What the supervisor and the commands that run beside it (a run's driver) connect to NATS with."""
        return self.nats_users.get(NATS_ADMIN) if self.embedded else env_credentials()

    @property
    def monitor_url(self) -> str | None:
        # A cluster has one per member: clients then judge the log by their connection (and NoQuorum).
        return self.nats.monitor_url if self.nats is not None else None

    def _watch_of(self, server: EmbeddedNats) -> _LogWatch:
        if self.cluster is None:
            return self._log
        return self._members.setdefault(server.store_dir.name, _LogWatch())

    async def start(self) -> None:
        s = self.settings
        self._lock = DataDirLock(s.data_dir)
        self._lock.acquire("up", "opengyre up")  # before anything starts; DataDirBusy / DataDirUnusable
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        s = self.settings
        self.reaped = await asyncio.to_thread(reap_leftovers, s)
        ports = self._wanted_ports(self.services)
        s.record()
        # Written once per data dir, before any service reads it; a second `up` keeps the same token.
        ensure_grpc_token(s.data_dir)
        if s.nats_url:
            self.nats_url = s.nats_url
        else:
            await self._start_nats()
        # Fail fast before any service starts. The stack owns the streams' configuration: it creates them and
        # sets their limits (services and the CLI only look them up), so a limit set here stays set.
        event_log = await EventLog.connect(self.nats_url, s.log, credentials=self.admin_credentials, configure=True)
        await event_log.close()
        if not s.db_url and (s.data_dir / "opengyre.db").exists():
            log.warning(
                "%s: each service now keeps its projections in db/<service>.db; they are rebuilt from the log, "
                "and opengyre.db is no longer read",
                s.data_dir,
            )
        s.ensure_store_dir()
        for url in dict.fromkeys(s.store_urls(self.services).values()):
            engine = create_db_engine(url)
            self.engines[url] = engine
            await asyncio.to_thread(migrate, engine)
        await self._start_children(ports)
        self._write_stack_file()

    async def add_service(self, name: str) -> None:
        """Start one more service in a running stack (one whose configuration is written only once the others
        have produced what it needs, as the trainer's ``trainer.toml`` in a run that warm-starts)."""
        if name in self.children:
            raise ValueError(f"service {name} already runs in this stack")
        if name not in SERVICE_CLASSES:
            raise ValueError(f"no service {name!r} (known: {', '.join(SERVICE_CLASSES)})")
        s = self.settings
        ports = self._wanted_ports([name])
        url = s.store_url(name)
        if url not in self.engines:
            engine = self.engines[url] = create_db_engine(url)
            await asyncio.to_thread(migrate, engine)
        self.services.append(name)
        await self._start_children(ports)
        self._write_stack_file()

    def _wanted_ports(self, names: list[str]) -> dict[str, int]:
        """Each service's gRPC port to bind: the configured one (0: any). Which one it gets is what it reports
        (``_start_children``): a default that is taken then is a free one, a port the user asked for an error —
        raised here already when it is taken now, in the user's words."""
        s = self.settings
        ports: dict[str, int] = {}
        for name in names:
            want = s.ports.get(name, 0)
            if name in s.explicit_ports and not port_is_free(want, s.host):
                raise PortTaken(f"port {want} of svc-{name} (OPENGYRE_{name.upper()}_PORT) is in use on {s.host}")
            ports[name] = want
        if "proxy" in names and PROXY_HTTP in s.explicit_ports and not port_is_free(s.proxy_http_port, s.host):
            raise PortTaken(
                f"port {s.proxy_http_port} of the proxy's HTTP gateway (OPENGYRE_PROXY_HTTP_PORT) is in use on {s.host}"
            )
        return ports

    async def _start_children(self, ports: dict[str, int]) -> None:
        """Start the services of ``ports``, each binding its port itself (falling back to a free one when a default
        is taken) and reporting the port it bound; one that needs another's address (``SERVICE_NEEDS``) starts
        once that one has reported."""
        s = self.settings
        pending = list(ports)
        while pending:
            wave = [n for n in pending if not any(d in pending for d in SERVICE_NEEDS.get(n, ()))]
            if not wave:
                raise RuntimeError(f"services that need each other's address cannot start: {', '.join(pending)}")
            for name in wave:
                child = self.children[name] = _Child(name, ports[name])
                self._spawn(child, fallback=name not in s.explicit_ports)
            for name in wave:
                await self._await_bound(self.children[name])
            pending = [n for n in pending if n not in wave]

    def _port_file(self, name: str) -> Path:
        return self.settings.data_dir / "ports" / name

    async def _await_bound(self, child: _Child, timeout: float = 60.0) -> None:
        """Wait for the port the service reports once it serves (a service that exits first did not start)."""
        if child.proc is None:  # not started (``_spawn`` sets it): reported as the loop before wait_ready did
            raise RuntimeError(
                f"service {child.name} exited with None before serving; see {self._log_path(child.name)}"
            )
        try:
            text = await wait_ready(self._port_file(child.name), proc=child.proc, timeout=timeout)
        except ExitedBeforeReady as exc:
            raise RuntimeError(
                f"service {child.name} exited with {exc.returncode} before serving; see {self._log_path(child.name)}"
            ) from None
        except TimeoutError:
            raise RuntimeError(
                f"service {child.name} did not start in {timeout:.0f} s; see {self._log_path(child.name)}"
            ) from None
        child.port, child.bound = int(text), True

    async def _start_nats(self) -> None:
        s = self.settings
        port = None
        old = s.nats_url_file.read_text().strip() if s.nats_url_file.exists() else ""
        if old.rsplit(":", 1)[-1].isdigit() and port_is_free(int(old.rsplit(":", 1)[-1]), "127.0.0.1"):
            port = int(old.rsplit(":", 1)[-1])  # keep the URL stable across restarts when possible
        # Users and permissions from the catalogue; the passwords are the ones an earlier `up` wrote.
        config = write_nats_config(s.data_dir, s.log)
        self.nats_users = ensure_nats_users(s.data_dir, [NATS_ADMIN, *SERVICE_CLASSES])
        # Loopback whatever --host says: only this machine's services use the embedded log (remote parts of a
        # deployment join an external NATS with --nats-url).
        if s.nats_cluster:
            self.cluster = NatsCluster(s.data_dir / NATS_CLUSTER_STORE, s.nats_cluster, config_file=config)
            self.cluster.launch()  # from the main thread, as below
            self.nats_url = await asyncio.to_thread(self.cluster.wait_ready)
            for server in self.cluster.nodes:
                self._watch_of(server).started_at = time.monotonic()
            _write_text(s.nats_url_file, self.nats_url + "\n")
            return
        self.nats = EmbeddedNats(s.data_dir / NATS_STORE, port=port, config_file=config)
        self.nats.launch()  # from this (the main) thread: its parent-death signal must outlive the call
        self.nats_url = await asyncio.to_thread(self.nats.wait_ready)
        self._log.started_at = time.monotonic()
        _write_text(s.nats_url_file, self.nats_url + "\n")

    def _log_path(self, name: str) -> Path:
        return self.settings.data_dir / "logs" / f"{name}.log"

    def _spawn(self, child: _Child, *, fallback: bool) -> None:
        """Start the service on ``child.port``; ``fallback``: a free port if that one is taken (a first start on a
        default port; a restart keeps the port the others were told)."""
        s = self.settings
        env = {**os.environ, **self.env}
        env.update(
            OPENGYRE_DATA_DIR=str(s.data_dir.resolve()),
            OPENGYRE_NATS_URL=self.nats_url,
            OPENGYRE_NATS_MONITOR_URL=self.monitor_url or "",
            OPENGYRE_DB_URL=s.db_url or "",
            OPENGYRE_STREAM=s.log.stream,
            # How long the services wait out a lost leader, and whether one lost is NoQuorum (``LogConfig``).
            OPENGYRE_LOG_REPLICAS=str(s.log.replicas),
            OPENGYRE_SUBJECT_PREFIX=s.log.prefix,
            OPENGYRE_HOST=s.host,
            OPENGYRE_SUPERVISOR_PID=str(os.getpid()),
        )
        if self.embedded:  # the service's own NATS user; with --nats-url, the user's env passes through
            creds = self.nats_users[child.name]
            env.pop(NATS_CREDS_ENV, None)
            env.update({NATS_USER_ENV: creds.user, NATS_PASSWORD_ENV: creds.password})
        # Every service learns where the others really are (the ports they reported: a default may have been taken).
        env.update({f"OPENGYRE_{c.name.upper()}_PORT": str(c.port) for c in self.children.values() if c.bound})
        if PROXY_HTTP in s.explicit_ports:
            env["OPENGYRE_PROXY_HTTP_PORT"] = str(s.proxy_http_port)
        else:
            env.pop("OPENGYRE_PROXY_HTTP_PORT", None)
        logf = self._log_path(child.name)
        logf.parent.mkdir(parents=True, exist_ok=True)
        port_file = self._port_file(child.name)
        port_file.unlink(missing_ok=True)  # what a previous run wrote is not this one's port
        with logf.open("ab") as out:
            child.proc = spawn(
                [
                    sys.executable,
                    "-m",
                    "opengyre.cli",
                    "service",
                    "run",
                    child.name,
                    "--port",
                    str(child.port),
                    *(["--port-fallback"] if fallback else []),
                    "--port-file",
                    str(port_file.resolve()),
                    "--data-dir",
                    str(s.data_dir.resolve()),
                ],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        child.started_at = time.monotonic()

    def _write_stack_file(self) -> None:
        """Record the stack in ``stack.json``. A full disk does not stop the stack: the write is tried again with
        backoff (the record then written is the state at that time) until it goes through; meanwhile readers
        see the previous record, whole (the write is atomic)."""
        if self._rewrite is not None and not self._rewrite.done():
            return  # the retry writes the record as it is when it gets through
        try:
            self._write_stack_file_now()
        except OSError as exc:
            if not is_no_space(exc):
                raise
            self.stack_file_failures += 1
            log.error("cannot write %s (%s): the stack runs on; retrying", self.settings.stack_file, exc)
            self._rewrite = asyncio.get_running_loop().create_task(self._rewrite_stack_file(), name="rewrite-stack")

    async def _rewrite_stack_file(self) -> None:
        async for attempt in backoff(
            f"writing {self.settings.stack_file}",
            first_s=0.5, max_s=5.0, retry_on=OSError, retry_if=is_no_space, logger=log,
            before_sleep=lambda _: self._count_stack_file_failure(),
        ):  # fmt: skip
            with attempt:
                self._write_stack_file_now()
        log.warning("wrote %s again: the disk has room", self.settings.stack_file)

    def _count_stack_file_failure(self) -> None:
        self.stack_file_failures += 1

    def _disk_full(self) -> bool:
        """Whether the data dir's disk has less room than ``log_min_free_mb``: too little to restart on."""
        try:
            free = shutil.disk_usage(self.settings.data_dir).free
        except OSError:
            return False
        return free < self.settings.log_min_free_mb * 2**20

    def _write_stack_file_now(self) -> None:
        s = self.settings
        proc = self.nats.proc if self.nats is not None else None
        data = {
            "pid": os.getpid(),
            "nats_url": self.nats_url,
            "nats_pid": proc.pid if proc is not None else 0,
            "nats_monitor_url": self.monitor_url,
            "embedded_nats": self.embedded,
            "nats_nodes": [
                {
                    "name": n.store_dir.name,
                    "url": n.url,
                    "pid": n.proc.pid if n.proc is not None and n.proc.poll() is None else 0,
                    "ok": self._watch_of(n).health.ok,
                    "reason": self._watch_of(n).health.reason,
                    "restarts": self._watch_of(n).restarts,
                }
                for n in (self.cluster.nodes if self.cluster is not None else [])
            ],
            "log": {"ok": self._log.health.ok, "reason": self._log.health.reason, "restarts": self._log.restarts},
            "stores": {name: _safe_url(url) for name, url in s.store_urls(self.services).items()},
            "stream": s.log.stream,
            "prefix": s.log.prefix,
            "host": s.host,
            "min_free_mb": s.log_min_free_mb,  # below it the disk counts as full (`status` says so)
            "http_limits": s.http.to_env(),  # what the services serve HTTP within (`status` says)
            "reaped": [str(x) for x in self.reaped],
            "services": {
                c.name: {"port": c.port, "pid": c.proc.pid if c.proc else 0, "restarts": c.restarts}
                for c in self.children.values()
            },
        }
        _write_json(s.stack_file, data)

    async def supervise(self, stop: asyncio.Event) -> None:
        """Until ``stop``: restart a crashed service (its projections resume from their tracking rows) and keep
        the embedded nats-server up and able to store."""
        next_check = 0.0
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
            if stop.is_set():
                break
            check = time.monotonic() >= next_check
            if check:
                next_check = time.monotonic() + self.health_every
            for server in self.servers:
                await self._keep_nats(server)
                running = server.proc is not None and server.proc.poll() is None
                if running and check:
                    await self._check_nats_health(server)
            if self.cluster is not None:
                self._cluster_health()
            for child in self.children.values():
                if child.proc is None or child.proc.poll() is None:
                    continue
                code = child.proc.returncode
                if self._disk_full():
                    # Whatever it died of, a restart now would die of a full disk too: wait for room, and do not
                    # count it towards the restart limit (the failure is the disk's, not the service's).
                    if not child.waiting_for_space:
                        child.waiting_for_space = True
                        log.error("service %s exited with %s; the data dir's disk is full: restarting it once "
                                  "there is room", child.name, code)  # fmt: skip
                    continue
                if child.waiting_for_space:
                    child.waiting_for_space = False
                    log.warning("service %s: the disk has room again; restarting it", child.name)
                    self._spawn(child, fallback=False)
                    self._write_stack_file()
                    continue
                # Exited by itself (not a signal's kill): the log's last line says why. The same line again is
                # the same failure however long the service ran first (a bad setting it reads at start).
                line = _last_line(self._log_path(child.name)) if code > 0 else ""
                same = bool(line) and line == child.last_error
                child.last_error = line
                if time.monotonic() - child.started_at > STABLE_AFTER_S and not same:
                    child.restarts = 0  # it had been running fine: this is a new failure, not a crash loop
                if child.restarts >= self.max_restarts:
                    if self.gave_up is None:
                        log.error("service %s exited with %s; restart limit reached: %s", child.name, code, line)
                        self.gave_up = ServiceFailed(
                            f"service {child.name} exited with {code} after {child.restarts} restart(s)"
                            + (f": {line}" if line else "")
                        )
                        self._given_up.set()
                    continue
                child.restarts += 1
                log.warning("service %s exited with %s; restarting (%d)", child.name, code, child.restarts)
                self._spawn(child, fallback=False)
                self._write_stack_file()

    async def watch(self, work: Awaitable[T]) -> T:
        """``work``'s result, unless a service reaches its restart limit first (``supervise`` running beside it):
        then ``work`` is cancelled and that ``ServiceFailed`` is raised, rather than waiting on it for ever."""
        task = asyncio.ensure_future(work)
        failed = asyncio.ensure_future(self._given_up.wait())
        try:
            await asyncio.wait({task, failed}, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                return task.result()
            assert self.gave_up is not None
            raise self.gave_up
        finally:
            failed.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _keep_nats(self, server: EmbeddedNats) -> None:
        """A nats-server that exited is started again on the same port and store (services reconnect); one
        that keeps dying soon after starting is retried with a backoff (0.5 s doubling to 30 s)."""
        proc = server.proc
        if proc is not None and proc.poll() is None:
            return
        w, now = self._watch_of(server), time.monotonic()
        if w.exited_at == 0.0:
            w.exited_at = now
            w.quick = w.quick + 1 if now - w.started_at < 10.0 else 0
            w.next_try = now + (min(30.0, 0.5 * 2 ** min(w.quick, 6)) if w.quick else 0.0)
            code = proc.returncode if proc is not None else "an error"
            log.error("nats-server %s exited with %s; restarting it on %s", self._name(server), code, server.url)
            w.health = LogHealth(False, f"nats-server exited with {code}; restarting it")
            self._write_stack_file()
        if now < w.next_try:
            return
        w.exited_at = 0.0
        await self._restart_nats(server, "it exited")

    def _name(self, server: EmbeddedNats) -> str:
        return server.store_dir.name if self.cluster is not None else ""

    async def _restart_nats(self, server: EmbeddedNats, why: str) -> None:
        w = self._watch_of(server)
        w.restarts += 1
        w.failed_checks = 0
        w.waiting_for_space = False
        w.health = LogHealth(False, f"restarting nats-server: {why}")
        self._write_stack_file()
        await asyncio.to_thread(server.stop)
        w.started_at = time.monotonic()
        server.launch()
        try:
            await asyncio.to_thread(server.wait_ready)
        except RuntimeError as exc:
            log.error("%s", exc)  # it exited again: _keep_nats tries again after a backoff
            return
        self._write_stack_file()

    async def _check_nats_health(self, server: EmbeddedNats) -> None:
        """Poll /healthz; a store that failed a write stays failed until nats-server restarts, which is done once
        the disk has room again (``log_min_free_mb``)."""
        w = self._watch_of(server)
        probe = self._probes.get(server.monitor_url)
        if probe is None:
            probe = self._probes[server.monitor_url] = HealthProbe(server.monitor_url)
        health = await probe.check(timeout=2.0)
        changed = health != w.health
        w.health = health
        w.failed_checks = 0 if health.ok else w.failed_checks + 1
        if health.ok:
            w.waiting_for_space = False
        elif self.cluster is not None and not health.store_failed:
            # A member catching up or in an election (after another member's restart) reports unhealthy until it
            # is current; restarting it then cost the cluster its majority under load (no stream leader for
            # minutes). The cluster heals that by itself; a member that exited is restarted by _keep_nats.
            pass
        elif w.failed_checks >= 3:  # not a blip during start-up
            free = shutil.disk_usage(server.store_dir).free
            need = self.settings.log_min_free_mb * 2**20
            if free >= need:
                log.error("event log unhealthy (%s); %d MiB free: restarting nats-server", health.reason, free >> 20)
                await self._restart_nats(server, health.reason)
                return
            if not w.waiting_for_space:
                w.waiting_for_space = True
                log.error(
                    "event log unhealthy (%s); waiting for %d MiB free in %s (%d MiB now) to restart nats-server",
                    health.reason,
                    need >> 20,
                    server.store_dir,
                    free >> 20,
                )
        if changed:
            self._write_stack_file()

    def _cluster_health(self) -> None:
        """The log as a whole: it takes appends while a majority of the cluster's members is healthy."""
        assert self.cluster is not None
        down = [n.store_dir.name for n in self.cluster.nodes if not self._watch_of(n).health.ok]
        quorum = self.cluster.size // 2 + 1
        if self.cluster.size - len(down) < quorum:
            health = LogHealth(
                False, f"no quorum: {len(down)} of {self.cluster.size} NATS servers down ({', '.join(down)})"
            )
        else:
            health = LogHealth(True, f"{', '.join(down)} down, the others keep a quorum" if down else "")
        self._log.restarts = sum(self._watch_of(n).restarts for n in self.cluster.nodes)
        if health != self._log.health:
            self._log.health = health
            self._write_stack_file()

    async def stop(self) -> None:
        if self._rewrite is not None:
            self._rewrite.cancel()
            await asyncio.gather(self._rewrite, return_exceptions=True)
        for child in self.children.values():
            if child.proc is not None and child.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.proc.pid, signal.SIGTERM)
        for child in self.children.values():
            if child.proc is None:
                continue
            try:
                await asyncio.to_thread(child.proc.wait, 15)
            except subprocess.TimeoutExpired:
                await asyncio.to_thread(stop_group, child.proc.pid, 1.0)
                await asyncio.to_thread(child.proc.wait)
        self._stop_nats()
        for probe in self._probes.values():
            await probe.aclose()
        self._probes.clear()
        for engine in self.engines.values():
            engine.dispose()
        self.engines.clear()
        if self._lock is not None and self._lock.held:
            data = read_stack_file(self.settings)
            if data and int(data.get("pid", 0)) == os.getpid():
                self.settings.stack_file.unlink(missing_ok=True)
            self._lock.release()

    def _stop_nats(self) -> None:
        if self.nats is not None:
            self.nats.stop()
            self.nats = None
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
    except OSError:
        tmp.unlink(missing_ok=True)  # half a file is no use to anyone, and takes room a full disk lacks
        raise
    tmp.replace(path)  # readers never see half a file


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
