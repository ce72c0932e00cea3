"""The embedded stack: nats-server (unless a URL is given), migrations, one process per service, restarts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from ..config import Settings
from ..eventlog import EventLog, LogUnavailable
from ..store import create_db_engine, migrate
from ._nats import EmbeddedNats
from ._ports import free_port, port_is_free, wait_for_port
from ._service import SERVICE_CLASSES

__all__ = ["Stack", "StackAlreadyRunning", "read_stack_file", "stack_alive"]

log = logging.getLogger(__name__)

STABLE_AFTER_S = 60.0


class StackAlreadyRunning(RuntimeError):
    pass


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_stack_file(settings: Settings) -> dict[str, Any] | None:
    f = settings.stack_file
    if not f.exists():
        return None
    try:
        data: dict[str, Any] = json.loads(f.read_text())
    except ValueError:
        return None
    return data


def stack_alive(settings: Settings) -> dict[str, Any] | None:
    data = read_stack_file(settings)
    if data and _pid_alive(int(data.get("pid", 0))):
        return data
    return None


@dataclass
class _Child:
    name: str
    port: int
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: float = 0.0


@dataclass
class Stack:
    """Start with ``start()``, supervise with ``supervise(stop)``, end with ``stop()``."""

    settings: Settings
    services: list[str] = field(default_factory=lambda: list(SERVICE_CLASSES))
    max_restarts: int = 5
    nats: EmbeddedNats | None = None
    nats_url: str = ""
    children: dict[str, _Child] = field(default_factory=dict)
    engine: Engine | None = None

    async def start(self) -> None:
        s = self.settings
        s.data_dir.mkdir(parents=True, exist_ok=True)
        running = stack_alive(s)
        if running:
            raise StackAlreadyRunning(
                f"a stack already runs on {s.data_dir} (pid {running['pid']}); stop it with `opengyre down`"
            )
        if s.nats_url:
            self.nats_url = s.nats_url
        else:
            port = None
            old = s.nats_url_file.read_text().strip() if s.nats_url_file.exists() else ""
            if old.rsplit(":", 1)[-1].isdigit() and port_is_free(int(old.rsplit(":", 1)[-1])):
                port = int(old.rsplit(":", 1)[-1])  # keep the URL stable across restarts when possible
            self.nats = EmbeddedNats(s.data_dir / "nats", port=port, host=s.host)
            self.nats_url = await asyncio.to_thread(self.nats.start)
            s.nats_url_file.write_text(self.nats_url + "\n")
        # Fail fast (and create the stream) before any service starts.
        try:
            event_log = await EventLog.connect(self.nats_url, s.log)
        except LogUnavailable:
            self._stop_nats()
            raise
        await event_log.close()
        self.engine = create_db_engine(s.database_url)
        await asyncio.to_thread(migrate, self.engine)
        for name in self.services:
            want = s.ports.get(name, 0)
            port = want if want and port_is_free(want, s.host) else free_port(s.host)
            self.children[name] = _Child(name, port)
            self._spawn(self.children[name])
        for child in self.children.values():
            ok = await asyncio.to_thread(wait_for_port, child.port, s.host, 60.0)
            if not ok:
                await self.stop()
                raise RuntimeError(f"service {child.name} did not start; see {self._log_path(child.name)}")
        self._write_stack_file()

    def _log_path(self, name: str) -> Path:
        return self.settings.data_dir / "logs" / f"{name}.log"

    def _spawn(self, child: _Child) -> None:
        s = self.settings
        env = dict(os.environ)
        env.update(
            OPENGYRE_DATA_DIR=str(s.data_dir.resolve()),
            OPENGYRE_NATS_URL=self.nats_url,
            OPENGYRE_DB_URL=s.database_url,
            OPENGYRE_STREAM=s.log.stream,
            OPENGYRE_SUBJECT_PREFIX=s.log.prefix,
            OPENGYRE_HOST=s.host,
            OPENGYRE_PROXY_HTTP_PORT=str(s.proxy_http_port),
        )
        logf = self._log_path(child.name)
        logf.parent.mkdir(parents=True, exist_ok=True)
        out = logf.open("ab")
        child.proc = subprocess.Popen(
            [sys.executable, "-m", "opengyre.cli", "service", "run", child.name, "--port", str(child.port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C goes to the supervisor, which stops children in order
        )
        out.close()
        child.started_at = time.monotonic()

    def _write_stack_file(self) -> None:
        data = {
            "pid": os.getpid(),
            "nats_url": self.nats_url,
            "embedded_nats": self.nats is not None,
            "db_url": self.settings.database_url,
            "host": self.settings.host,
            "services": {
                c.name: {"port": c.port, "pid": c.proc.pid if c.proc else 0, "restarts": c.restarts}
                for c in self.children.values()
            },
        }
        self.settings.stack_file.write_text(json.dumps(data, indent=2) + "\n")

    async def supervise(self, stop: asyncio.Event) -> None:
        """Restart a crashed service (its projections resume from their tracking rows) until ``stop``."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
            if stop.is_set():
                break
            for child in self.children.values():
                if child.proc is None or child.proc.poll() is None:
                    continue
                code = child.proc.returncode
                if time.monotonic() - child.started_at > STABLE_AFTER_S:
                    child.restarts = 0  # it had been running fine: this is a new failure, not a crash loop
                if child.restarts >= self.max_restarts:
                    log.error("service %s exited with %s; restart limit reached", child.name, code)
                    continue
                child.restarts += 1
                log.warning("service %s exited with %s; restarting (%d)", child.name, code, child.restarts)
                self._spawn(child)
                self._write_stack_file()

    async def stop(self) -> None:
        for child in self.children.values():
            if child.proc is not None and child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        for child in self.children.values():
            if child.proc is None:
                continue
            try:
                await asyncio.to_thread(child.proc.wait, 15)
            except subprocess.TimeoutExpired:
                child.proc.kill()
                await asyncio.to_thread(child.proc.wait)
        self._stop_nats()
        if self.engine is not None:
            self.engine.dispose()
        data = read_stack_file(self.settings)
        if data and int(data.get("pid", 0)) == os.getpid():
            self.settings.stack_file.unlink(missing_ok=True)

    def _stop_nats(self) -> None:
        if self.nats is not None:
            self.nats.stop()
            self.nats = None
