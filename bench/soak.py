"""Soak: a sustained stream of recorded model calls through the real embedded stack, with a SIGKILL every few
minutes, counting per call what was acknowledged, recorded, applied, lost and doubled.

    .venv/bin/python bench/soak.py                                   # 30 minutes, a fault every 3 minutes
    .venv/bin/python bench/soak.py --duration 90 --fault-every 30 --targets nats-server,svc-proxy   # a smoke

The stack is brought up as an operator does: the built-in CPU engine (``opengyre engine --preset tiny``) and
``opengyre up --detach`` (supervisor, embedded nats-server, every service as its own process) with the engine
as the proxy's static rollout engine (``OPENGYRE_PROXY_ENGINES``). Several clients — the official ``openai``
SDK, no retries of its own — each run executions one after another: the scheduler's ``execution-dispatched``
appended to the log (retried with the same event until acknowledged, as a careful publisher does), then 2-5
chat turns that extend the conversation (so each execution's trajectory tree grows; a turn that failed is
retried and may become a sibling), then ``execution-finished``.

Every ``--fault-every`` seconds one process of the stack is SIGKILLed, picked at random (seeded) from
``--targets``, going through every target once before repeating: nats-server and each service (the supervisor
restarts them), the engine (restarted on its port, as an operator would), or the supervisor itself (its
children die with it; ``opengyre up`` is run again). After ``--duration`` the clients stop, the stack is left
to drain (the proxy's outbox empty, every recorded call folded by both projections) and each call is counted:

* acknowledged: the client received HTTP 200 (its call id is the response's ``chatcmpl-<call id>``);
* refused: the client got an error — allowed, not lost (the harness retries);
* recorded: ``model-call-recorded`` events in the log for that call id;
* applied: a row in the proxy's trajectory store (``proxy_calls``) and in the trainer's (``trainer_calls``);
* lost: acknowledged but not recorded, or recorded but not applied by a projection;
* doubled: two events for one call, or a projection dead-lettering a call as already recorded.

After the traffic one more call is retried until answered: the stack serves again after the last fault. Exits 1
when anything is lost or doubled, or when the stack does not serve again or does not drain (stuck).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai

from opengyre.eventlog import EventLog, LogUnavailable
from opengyre.events import Event, ExecutionDispatched, ExecutionFinished, ModelCallRecorded
from opengyre.proxy import ExecutionKeys
from opengyre.runtime import NATS_ADMIN, read_nats_credentials

CLI = [sys.executable, "-m", "opengyre.cli"]
SERVICES = ("synth", "scheduler", "proxy", "trainer", "bench")
MODEL = "opengyre-tiny"
WORDS = [
    "plan",
    "read",
    "the",
    "file",
    "then",
    "patch",
    "the",
    "failing",
    "test",
    "and",
    "run",
    "it",
    "again",
    "until",
    "green",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    return True


# ---------------------------------------------------------------------------------------------------- the stack


@dataclass
class Stack:
    """The engine and `opengyre up --detach` on one data dir, and what an operator does after a fault."""

    data: Path
    services: list[str]
    engine_port: int = field(default_factory=free_port)
    proxy_port: int = field(default_factory=free_port)
    engine: subprocess.Popen[bytes] | None = None
    ups: int = 0

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "OPENGYRE_PROXY_ENGINES": f"http://127.0.0.1:{self.engine_port}",
            "OPENGYRE_PROXY_HTTP_PORT": str(self.proxy_port),
            "COLUMNS": "200",
        }

    @property
    def proxy_url(self) -> str:
        return f"http://127.0.0.1:{self.proxy_port}"

    def record(self) -> dict[str, Any]:
        try:
            got: dict[str, Any] = json.loads((self.data / "stack.json").read_text())
        except (OSError, ValueError):
            return {}
        return got

    def start_engine(self) -> None:
        logf = (self.data / "engine.log").open("ab")
        args = [*CLI, "engine", "--preset", "tiny", "--port", str(self.engine_port), "--threads", "1"]
        # Its own session: the engine is not the stack's (an operator runs it beside `opengyre up`).
        self.engine = subprocess.Popen(args, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        logf.close()

    def engine_ready(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.engine_port}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def up(self) -> None:
        """`opengyre up --detach`, tried again while it fails (e.g. the previous stack's leftovers still dying)."""
        for attempt in range(10):
            res = subprocess.run(
                [*CLI, "up", "--detach", "--data-dir", str(self.data), "--services", ",".join(self.services)],
                capture_output=True,
                text=True,
                env=self.env,
                timeout=300,
            )
            if res.returncode == 0:
                self.ups += 1
                return
            print(f"  `opengyre up` failed (attempt {attempt + 1}): {(res.stdout + res.stderr)[-400:]}", flush=True)
            time.sleep(2)
        raise RuntimeError("`opengyre up` keeps failing")

    def down(self) -> None:
        subprocess.run([*CLI, "down", "--data-dir", str(self.data)], capture_output=True, env=self.env, timeout=120)
        if self.engine is not None and self.engine.poll() is None:
            self.engine.terminate()
            self.engine.wait(30)

    def targets(self) -> dict[str, int]:
        """Every process of the stack by target name, with its pid."""
        rec = self.record()
        out = {"supervisor": int(rec.get("pid") or 0), "nats-server": int(rec.get("nats_pid") or 0)}
        for name, info in (rec.get("services") or {}).items():
            out[f"svc-{name}"] = int(info.get("pid") or 0)
        out["engine"] = self.engine.pid if self.engine is not None else 0
        return out

    def kill(self, target: str) -> int:
        pid = self.targets().get(target, 0)
        if not pid or not pid_alive(pid):
            return 0
        os.kill(pid, signal.SIGKILL)
        return pid

    def recover(self, target: str, pid: int) -> None:
        """What an operator does: restart the engine; run `opengyre up` again after the supervisor died. The
        supervisor restarts nats-server and services by itself."""
        if target == "engine" and self.engine is not None:
            self.engine.wait()
            self.start_engine()
        elif target == "supervisor":
            while pid_alive(pid):
                time.sleep(0.05)
            self.up()

    def outbox_waiting(self) -> int:
        path = self.data / "proxy-outbox.sqlite3"
        if not path.exists():
            return 0
        try:
            with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)) as db:
                return int(db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])
        except sqlite3.OperationalError:
            return -1  # busy or not created yet: not drained as far as we know


# ---------------------------------------------------------------------------------------------------- the clients


@dataclass
class Call:
    client: int
    execution_id: str
    turn: int
    sent: float
    done: float
    ok: bool
    call_id: str = ""
    error: str = ""


@dataclass
class Fault:
    at: float
    target: str
    pid: int
    recovered_at: float = 0.0  # the first acknowledged call after it


@dataclass
class Publisher:
    """Appends events, each retried with the same event (same id: the log drops a repeat) until acknowledged."""

    stack: Stack
    log: EventLog | None = None
    acked: list[Event] = field(default_factory=list)
    refusals: int = 0

    async def append(self, event: Event, tries: int = 1200) -> None:
        for _ in range(tries):
            try:
                if self.log is None:
                    url = self.stack.record().get("nats_url") or (self.stack.data / "nats.url").read_text().strip()
                    admin = read_nats_credentials(self.stack.data, NATS_ADMIN)  # the embedded log requires a user
                    self.log = await EventLog.connect(url, create=False, credentials=admin)
                await self.log.append(event)
                self.acked.append(event)
                return
            except (LogUnavailable, OSError, TimeoutError) as exc:
                self.refusals += 1
                if isinstance(exc, OSError):
                    await self.close()
            await asyncio.sleep(0.5)
        raise RuntimeError(f"{event.type_name()} {event.event_id} never acknowledged")

    async def close(self) -> None:
        if self.log is not None:
            with contextlib.suppress(Exception):
                await self.log.close()
            self.log = None


@dataclass
class Driver:
    stack: Stack
    seed: int
    clients: int
    max_tokens: int
    calls: list[Call] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    executions: int = 0
    t0: float = field(default_factory=time.monotonic)

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def _call(
        self, c: int, eid: str, turn: int, client: openai.AsyncOpenAI, msgs: list[dict[str, str]]
    ) -> str | None:
        sent = self.now()
        try:
            r = await client.chat.completions.create(
                model=MODEL,
                messages=msgs,  # type: ignore[arg-type]
                max_tokens=self.max_tokens,
                temperature=1.0,
            )
        except openai.APIError as exc:
            self.calls.append(Call(c, eid, turn, sent, self.now(), False, error=f"{type(exc).__name__}: {exc}"[:200]))
            return None
        done = self.now()
        call_id = r.id.removeprefix("chatcmpl-")
        self.calls.append(Call(c, eid, turn, sent, done, True, call_id=call_id))
        for f in self.faults:
            if f.recovered_at == 0.0 and sent >= f.at:
                f.recovered_at = done
        return r.choices[0].message.content or ""

    async def client(self, c: int, stop: asyncio.Event, http: openai.DefaultAsyncHttpxClient) -> None:
        rng = random.Random(self.seed * 1000 + c)
        pub = Publisher(self.stack)
        keys: ExecutionKeys | None = None
        try:
            n = 0
            while not stop.is_set():
                n += 1
                eid = f"soak-{self.seed}-{c}-{n}-{uuid.uuid4().hex[:6]}"
                await pub.append(ExecutionDispatched(execution_id=eid, task_id="soak", group_id=eid))
                self.executions += 1
                if keys is None:
                    keys = ExecutionKeys(bytes.fromhex((self.stack.data / "proxy.secret").read_text().strip()))
                client = openai.AsyncOpenAI(
                    base_url=f"{self.stack.proxy_url}/x/{eid}/v1",
                    api_key=keys.issue(eid),
                    max_retries=0,
                    timeout=90,
                    http_client=http,
                )
                msgs = [{"role": "user", "content": " ".join(rng.choices(WORDS, k=rng.randint(4, 12)))}]
                for turn in range(rng.randint(2, 5)):
                    while True:  # a harness retries a failed turn (the retry may be recorded as a sibling)
                        out = await self._call(c, eid, turn, client, msgs)
                        if out is not None or stop.is_set():
                            break
                        await asyncio.sleep(rng.uniform(0.3, 1.0))
                    if out is None:
                        break
                    msgs += [
                        {"role": "assistant", "content": out},
                        {"role": "user", "content": " ".join(rng.choices(WORDS, k=rng.randint(2, 8)))},
                    ]
                await pub.append(ExecutionFinished(execution_id=eid, status="completed", score=rng.random()))
        finally:
            await pub.close()

    async def probe(self, http: openai.DefaultAsyncHttpxClient, bound_s: float) -> bool:
        """After the traffic: one more execution whose one call is retried until answered (bounded), so the stack
        is shown to serve again after the last fault, or to be stuck."""
        pub = Publisher(self.stack)
        eid = f"soak-{self.seed}-probe-{uuid.uuid4().hex[:6]}"
        try:
            await pub.append(ExecutionDispatched(execution_id=eid, task_id="soak", group_id=eid))
            keys = ExecutionKeys(bytes.fromhex((self.stack.data / "proxy.secret").read_text().strip()))
            client = openai.AsyncOpenAI(
                base_url=f"{self.stack.proxy_url}/x/{eid}/v1",
                api_key=keys.issue(eid),
                max_retries=0,
                timeout=90,
                http_client=http,
            )
            deadline = time.monotonic() + bound_s
            while time.monotonic() < deadline:
                if await self._call(-1, eid, 0, client, [{"role": "user", "content": "still there?"}]) is not None:
                    await pub.append(ExecutionFinished(execution_id=eid, status="completed", score=1.0))
                    return True
                await asyncio.sleep(1)
            return False
        finally:
            await pub.close()

    async def faulter(
        self, stop: asyncio.Event, targets: list[str], every: float, duration: float, rng: random.Random
    ) -> None:
        """A SIGKILL every ``every`` seconds; one whose recovery (an operator's restart) overran leaves at least
        half a period before the next, so faults never pile up on a stack still coming back."""
        order: list[str] = []
        at = every
        while at < duration:  # no fault at the very end: the traffic after it shows the recovery
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, at - self.now()))
            if stop.is_set():
                return
            if not order:
                order = rng.sample(targets, len(targets))
            target = order.pop()
            pid = await asyncio.to_thread(self.stack.kill, target)
            fault = Fault(self.now(), target, pid)
            self.faults.append(fault)
            print(f"[{fault.at:7.1f}s] SIGKILL {target} (pid {pid})", flush=True)
            await asyncio.to_thread(self.stack.recover, target, pid)
            at = max(fault.at + every, self.now() + every / 2)


# ---------------------------------------------------------------------------------------------------- counting


def _rows(db_path: Path, query: str) -> list[tuple[Any, ...]]:
    if not db_path.exists():
        return []
    with contextlib.closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=30)) as db:
        return list(db.execute(query).fetchall())


async def read_log(url: str, data: Path) -> tuple[dict[str, list[int]], dict[str, int]]:
    """Call id -> the sequences of its model-call-recorded events; event type -> count."""
    log = await EventLog.connect(url, create=False, credentials=read_nats_credentials(data, NATS_ADMIN))
    calls: dict[str, list[int]] = {}
    kinds: dict[str, int] = {}
    try:
        last = await log.last_seq()
        async for stored in log.read(1, last):
            kinds[stored.type_name] = kinds.get(stored.type_name, 0) + 1
            if stored.type_name == ModelCallRecorded.type_name():
                e = log.decode(stored)
                assert isinstance(e, ModelCallRecorded)
                calls.setdefault(e.call_id, []).append(stored.seq)
    finally:
        await log.close()
    return calls, kinds


@dataclass
class Applied:
    proxy: dict[str, int]  # call id -> seq in proxy_calls
    trainer: dict[str, int]  # call id -> seq in trainer_calls
    tracked: dict[str, set[int]]  # projection -> tracked seqs
    dead: list[tuple[str, int, str, str, str]]  # projection, seq, type, reason, detail


def read_applied(data: Path) -> Applied:
    proxy_db, trainer_db = data / "db" / "proxy.db", data / "db" / "trainer.db"
    tracked: dict[str, set[int]] = {"trajectories": set(), "trainer": set()}
    dead: list[tuple[str, int, str, str, str]] = []
    for path in (proxy_db, trainer_db):
        for p, s in _rows(path, "SELECT projection, stream_seq FROM og_tracking"):
            tracked.setdefault(p, set()).add(int(s))
        dead += _rows(path, "SELECT projection, stream_seq, event_type, reason, detail FROM og_dead_letters")
    return Applied(
        proxy={c: int(s) for c, s in _rows(proxy_db, "SELECT call_id, seq FROM proxy_calls")},
        trainer={c: int(s) for c, s in _rows(trainer_db, "SELECT call_id, seq FROM trainer_calls")},
        tracked=tracked,
        dead=dead,
    )


def settled(stack: Stack, in_log: dict[str, list[int]], applied: Applied) -> bool:
    seqs = {s for v in in_log.values() for s in v}
    return stack.outbox_waiting() == 0 and all(
        seqs <= applied.tracked.get(p, set()) for p in ("trajectories", "trainer")
    )


async def drain(stack: Stack, bound_s: float) -> tuple[dict[str, list[int]], dict[str, int], Applied, bool]:
    """Wait (bounded) until the outbox is empty and both projections folded every recorded call."""
    deadline = time.monotonic() + bound_s
    while True:
        url = stack.record().get("nats_url", "")
        try:
            in_log, kinds = await read_log(url, stack.data) if url else ({}, {})
        except LogUnavailable:
            in_log, kinds = {}, {}
        applied = read_applied(stack.data)
        if url and settled(stack, in_log, applied):
            # Once more: the outbox may have emptied between reading the log and reading the stores.
            in_log, kinds = await read_log(url, stack.data)
            applied = read_applied(stack.data)
            if settled(stack, in_log, applied):
                return in_log, kinds, applied, True
        if time.monotonic() > deadline:
            return in_log, kinds, applied, False
        await asyncio.sleep(2)


def summarize(
    driver: Driver, in_log: dict[str, list[int]], kinds: dict[str, int], applied: Applied, drained: bool
) -> dict[str, Any]:
    acked = [c for c in driver.calls if c.ok]
    refused = [c for c in driver.calls if not c.ok]
    acked_ids = {c.call_id for c in acked}
    lost_log = sorted(acked_ids - set(in_log))
    lost_proxy = sorted(i for i in in_log if i not in applied.proxy)
    lost_trainer = sorted(i for i in in_log if i not in applied.trainer)
    doubled_log = sorted(i for i, v in in_log.items() if len(v) > 1)
    doubled_ack = len(acked) - len(acked_ids)  # one call id answered twice
    # A second event for a call is dead-lettered by both projections ("already recorded"): counted once, here.
    lost_ids = set(lost_log) | set(lost_proxy) | set(lost_trainer)
    doubled_ids = set(doubled_log)
    windows = []
    bounds = [f.at for f in driver.faults] + [float("inf")]
    for i, f in enumerate(driver.faults):
        in_window = [c for c in driver.calls if bounds[i] <= c.sent < bounds[i + 1]]
        ok = [c for c in in_window if c.ok]
        windows.append(
            {
                "at_s": round(f.at, 1),
                "target": f.target,
                "pid": f.pid,
                "acked": len(ok),
                "refused": len(in_window) - len(ok),
                "recovery_s": round(f.recovered_at - f.at, 1) if f.recovered_at else None,
                "lost": sum(1 for c in ok if c.call_id in lost_ids),
                "doubled": sum(1 for c in ok if c.call_id in doubled_ids),
            }
        )
    elapsed = max((c.done for c in driver.calls), default=0.0)
    return {
        "elapsed_s": round(elapsed, 1),
        "executions": driver.executions,
        "attempted": len(driver.calls),
        "acknowledged": len(acked),
        "refused": len(refused),
        "recorded_events": sum(len(v) for v in in_log.values()),
        "recorded_calls": len(in_log),
        "recorded_refused": sum(1 for i in in_log if i not in acked_ids),  # answered with an error, still recorded
        "applied_proxy": sum(1 for i in acked_ids if i in applied.proxy),
        "applied_trainer": sum(1 for i in acked_ids if i in applied.trainer),
        "lost": len(lost_ids),
        "lost_not_in_log": lost_log[:20],
        "lost_not_in_proxy_store": lost_proxy[:20],
        "lost_not_in_trainer_store": lost_trainer[:20],
        "doubled": len(doubled_ids) + doubled_ack,
        "doubled_in_log": doubled_log[:20],
        "dead_letters": [list(d) for d in applied.dead[:20]],
        "n_dead_letters": len(applied.dead),
        "events_by_type": kinds,
        "drained": drained,
        "stack_ups": driver.stack.ups,
        "acked_per_s": round(len(acked) / elapsed, 2) if elapsed else 0.0,
        "refusals": sorted({c.error.split(":")[0] for c in refused}),
        "faults": windows,
    }


def report(s: dict[str, Any]) -> None:
    print()
    print(
        f"soak: {s['elapsed_s']} s, {s['executions']} executions, {len(s['faults'])} faults, `up` run {s['stack_ups']}x"
    )
    print(f"  calls attempted      {s['attempted']:>8}")
    print(f"  acknowledged (200)   {s['acknowledged']:>8}   ({s['acked_per_s']} /s)")
    print(f"  refused (errors)     {s['refused']:>8}   {', '.join(s['refusals'])}")
    print(
        f"  recorded in the log  {s['recorded_calls']:>8}   ({s['recorded_events']} events; {s['recorded_refused']} of calls the client saw fail)"
    )
    print(f"  applied: proxy store {s['applied_proxy']:>8}   trainer store {s['applied_trainer']}")
    print(f"  lost                 {s['lost']:>8}")
    print(f"  doubled              {s['doubled']:>8}")
    print(f"  dead letters         {s['n_dead_letters']:>8}")
    print(f"  drained              {s['drained']!s:>8}")
    print(f"  serving after faults {s['serving_after_faults']!s:>8}")
    if s["faults"]:
        print()
        print(
            f"  {'#':>2} {'at s':>7} {'target':<15} {'pid':>7} {'acked':>6} {'refused':>7} {'recovery s':>10} {'lost':>5} {'doubled':>7}"
        )
        for i, f in enumerate(s["faults"], 1):
            rec = "-" if f["recovery_s"] is None else f"{f['recovery_s']:.1f}"
            print(
                f"  {i:>2} {f['at_s']:>7.1f} {f['target']:<15} {f['pid']:>7} {f['acked']:>6} {f['refused']:>7} "
                f"{rec:>10} {f['lost']:>5} {f['doubled']:>7}"
            )
    for key in ("lost_not_in_log", "lost_not_in_proxy_store", "lost_not_in_trainer_store", "doubled_in_log"):
        if s[key]:
            print(f"  {key}: {s[key]}")
    if s["dead_letters"]:
        print(f"  dead letters: {s['dead_letters'][:5]}")


# ---------------------------------------------------------------------------------------------------- main


async def soak(args: argparse.Namespace, data: Path) -> dict[str, Any]:
    services = [s.strip() for s in args.services.split(",") if s.strip()]
    targets = [t.strip() for t in args.targets.split(",") if t.strip()] if args.targets else None
    data.mkdir(parents=True, exist_ok=True)
    stack = Stack(data, services)
    known = {"supervisor", "nats-server", "engine", *(f"svc-{s}" for s in services)}
    targets = targets or sorted(known)
    if unknown := set(targets) - known:
        raise SystemExit(f"unknown targets {sorted(unknown)}; known: {sorted(known)}")
    print(
        f"soak: data {data}, services {services}, targets {targets}, every {args.fault_every} s for {args.duration} s"
    )
    stack.start_engine()
    try:
        stack.up()
        for _ in range(600):
            if stack.engine_ready():
                break
            await asyncio.sleep(0.5)
        else:
            raise RuntimeError(f"the engine did not come up; see {data / 'engine.log'}")
        driver = Driver(stack, args.seed, args.clients, args.max_tokens)
        stop = asyncio.Event()
        async with openai.DefaultAsyncHttpxClient(timeout=90) as http:  # one pool for every client
            driver.t0 = time.monotonic()
            tasks = [asyncio.create_task(driver.client(c, stop, http)) for c in range(args.clients)]
            faults = asyncio.create_task(
                driver.faulter(stop, targets, args.fault_every, args.duration, random.Random(args.seed))
            )
            last = 0.0
            while driver.now() < args.duration:
                await asyncio.sleep(1)
                if driver.now() - last >= args.progress_every:
                    last = driver.now()
                    ok = sum(1 for c in driver.calls if c.ok)
                    print(f"[{last:7.1f}s] acked {ok}, refused {len(driver.calls) - ok}", flush=True)
            stop.set()
            await faults
            await asyncio.gather(*tasks)
            print(f"[{driver.now():7.1f}s] clients stopped; a last call until answered ...", flush=True)
            serving = await driver.probe(http, args.drain_bound)
        print(f"[{driver.now():7.1f}s] draining ...", flush=True)
        in_log, kinds, applied, drained = await drain(stack, args.drain_bound)
        return summarize(driver, in_log, kinds, applied, drained) | {"serving_after_faults": serving}
    finally:
        stack.down()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=1800.0, help="seconds of traffic")
    ap.add_argument("--fault-every", type=float, default=180.0, help="seconds between SIGKILLs")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--clients", type=int, default=4, help="concurrent harnesses")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--services", default=",".join(SERVICES), help="what `opengyre up` runs")
    ap.add_argument("--targets", default="", help="processes to kill (default: all of the stack's)")
    ap.add_argument("--data-dir", type=Path, default=None, help="default: a temporary folder")
    ap.add_argument("--drain-bound", type=float, default=300.0, help="seconds allowed to drain after the traffic")
    ap.add_argument("--progress-every", type=float, default=60.0)
    ap.add_argument("--json", type=Path, default=None, help="also write the summary here")
    args = ap.parse_args()
    if args.data_dir is not None:
        summary = asyncio.run(soak(args, args.data_dir))
    else:
        with tempfile.TemporaryDirectory(prefix="og-soak-") as tmp:
            summary = asyncio.run(soak(args, Path(tmp) / "og"))
    report(summary)
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    ok = summary["lost"] == 0 and summary["doubled"] == 0 and summary["drained"] and summary["serving_after_faults"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
