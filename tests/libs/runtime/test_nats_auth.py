"""The embedded nats-server's users and permissions, generated from the event catalogue, against a real server:
each service may append only the events of its aggregates, nobody without credentials gets in at all."""

from __future__ import annotations

import contextlib
import json
import stat
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats.errors
import pytest
from nats.aio.client import Client

from opengyre.config import Settings
from opengyre.eventlog import ConcurrencyError, EventLog, EventLogError, LogConfig, LogUnavailable, NatsCredentials
from opengyre.events import (
    CellEngineChanged,
    ExecutionDispatched,
    ExecutionFinished,
    ModelCallRecorded,
    SkillIngested,
    default_registry,
)
from opengyre.runtime import (
    NATS_ADMIN,
    SERVICE_CLASSES,
    EmbeddedNats,
    Stack,
    ensure_nats_users,
    nats_config_file,
    read_nats_credentials,
    write_nats_config,
)

from ..._polling import await_until


@pytest.fixture
def secured(tmp_path: Path, log_config: LogConfig) -> Iterator[tuple[EmbeddedNats, dict[str, NatsCredentials]]]:
    data = tmp_path / "data"
    server = EmbeddedNats(tmp_path / "store", config_file=write_nats_config(data, log_config))
    server.start()
    yield server, ensure_nats_users(data, [NATS_ADMIN, *SERVICE_CLASSES])
    server.stop()


class _Refusals:
    def __init__(self) -> None:
        self.seen: list[str] = []

    async def on_error(self, exc: Exception) -> None:  # nats-py wants a coroutine function
        if "permissions violation" in str(exc).lower():
            self.seen.append(str(exc))


@contextlib.asynccontextmanager
async def _raw(url: str, creds: NatsCredentials | None, refusals: _Refusals) -> AsyncIterator[Client]:
    nc = Client()
    await nc.connect(
        url,
        error_cb=refusals.on_error,
        allow_reconnect=False,
        connect_timeout=3,
        **(creds.connect_options() if creds else {}),
    )
    try:
        yield nc
    finally:
        await nc.close()


async def test_each_service_appends_only_its_own_aggregates_and_the_rest_is_refused(
    secured: tuple[EmbeddedNats, dict[str, NatsCredentials]], log_config: LogConfig
) -> None:
    server, users = secured
    admin = await EventLog.connect(server.url, log_config, credentials=users[NATS_ADMIN])
    try:
        registry = default_registry()
        types = registry.types()
        shared = registry.shared_aggregates()

        def subject(tag: str, aggregate: str, user: str) -> str:
            # What the appender writes: a shared aggregate's subject carries the event's type.
            return log_config.subject(aggregate, f"{tag}-by-{user}", tag if aggregate in shared else None)

        expected_stored: set[str] = set()
        expected_refused = 0
        refusals: dict[str, _Refusals] = {}
        for user in SERVICE_CLASSES:
            refusals[user] = _Refusals()
            async with _raw(server.url, users[user], refusals[user]) as nc:
                mine = 0
                for tag, cls in types.items():
                    await nc.publish(subject(tag, cls.aggregate, user), b"{}", headers={"Og-Type": tag})
                    if cls.owner == user:
                        expected_stored.add(subject(tag, cls.aggregate, user))
                    else:
                        mine += 1
                # The older, untyped subject of a shared aggregate: nobody but admin publishes there any more.
                for aggregate in shared:
                    await nc.publish(log_config.subject(aggregate, f"untyped-by-{user}"), b"{}")
                    mine += 1
                expected_refused += mine
                await nc.flush()
                # Each refusal is an -ERR the server sends as it goes: wait for them on this connection.
                await await_until(lambda r=refusals[user], n=mine: len(r.seen) >= n, f"{user}'s {mine} refusals")

        # A core publish is stored by JetStream after the flush returns: wait until the stream holds as many
        # messages as were to be stored (read at once, the last user's were missing once under the suite's load).
        async def held() -> bool:
            info = await admin.js.stream_info(log_config.stream)
            return info.state.messages >= len(expected_stored)

        await await_until(held, "the owners' appends stored")
        stored = {s.subject async for s in admin.read(1)}
        refused = sum(len(r.seen) for r in refusals.values())
        # Every owner's append was stored, and nothing a non-owner of the event type sent.
        assert stored == expected_stored
        assert refused == expected_refused and refused > 0
        for tag, cls in types.items():
            assert subject(tag, cls.aggregate, cls.owner) in stored, tag
        # The finding: only the scheduler appends cell-engine-changed (no other service owns a cell event).
        cell = CellEngineChanged.aggregate
        assert {u for u in SERVICE_CLASSES if subject("cell-engine-changed", cell, u) in stored} == {"scheduler"}
        # The shared aggregate: each of its three owners publishes its own types on the same execution, no other's.
        assert shared == {"execution"}
        for tag in ("execution-dispatched", "model-call-recorded", "execution-finished", "payloads-compacted"):
            assert {u for u in SERVICE_CLASSES if subject(tag, "execution", u) in stored} == {types[tag].owner}
    finally:
        await admin.close()


async def test_no_credentials_or_a_wrong_password_gets_no_connection(
    secured: tuple[EmbeddedNats, dict[str, NatsCredentials]], log_config: LogConfig
) -> None:
    server, _ = secured
    attempts = [None, NatsCredentials(user="synth", password="not-its-password"), NatsCredentials("nobody", "x")]
    refused = 0
    for creds in attempts:
        try:
            async with _raw(server.url, creds, _Refusals()):
                pass
        except (nats.errors.Error, OSError):
            refused += 1
    assert refused == len(attempts)
    with pytest.raises(LogUnavailable, match="refuses a connection without credentials"):
        await EventLog.connect(server.url, log_config, timeout=3)


async def test_a_service_can_neither_subscribe_to_events_nor_manage_the_streams(
    secured: tuple[EmbeddedNats, dict[str, NatsCredentials]], log_config: LogConfig
) -> None:
    server, users = secured
    admin = await EventLog.connect(server.url, log_config, credentials=users[NATS_ADMIN])
    try:
        refusals = _Refusals()
        async with _raw(server.url, users["proxy"], refusals) as nc:
            await nc.subscribe(log_config.all_subjects)
            await nc.publish(f"$JS.API.STREAM.DELETE.{log_config.stream}", b"", reply=nc.new_inbox())
            await nc.publish(f"$JS.API.STREAM.PURGE.{log_config.stream}", b"", reply=nc.new_inbox())
            await nc.flush()
            await await_until(lambda: len(refusals.seen) >= 3, "the proxy's 3 refusals")
        async with _raw(server.url, users["synth"], refusals) as nc:
            await nc.publish(f"{log_config.payloads}.ex-1.d", b"only the proxy records token payloads")
            await nc.publish(f"$JS.API.STREAM.PURGE.{log_config.payloads}", b"", reply=nc.new_inbox())
            await nc.flush()
            await await_until(lambda: len(refusals.seen) >= 5, "synth's 2 refusals")
        assert len(refusals.seen) == 5, refusals.seen
        assert (await admin.js.stream_info(log_config.stream)).config.name == log_config.stream
    finally:
        await admin.close()


async def test_a_service_user_reads_appends_blobs_and_payloads_through_the_event_log(
    secured: tuple[EmbeddedNats, dict[str, NatsCredentials]], log_config: LogConfig
) -> None:
    """What the JetStream client side needs is allowed: consumers, acks, the object store, the payload stream."""
    server, users = secured
    admin = await EventLog.connect(server.url, log_config, credentials=users[NATS_ADMIN])
    synth = await EventLog.connect(server.url, log_config, credentials=users["synth"])
    proxy = await EventLog.connect(server.url, log_config, credentials=users["proxy"])
    trainer = await EventLog.connect(server.url, log_config, credentials=users["trainer"])
    try:
        big = SkillIngested(skill_id="big", name="b", description="x" * (log_config.inline_limit + 1))
        await synth.append(big)  # out of band: the blob bucket
        await synth.append(SkillIngested(skill_id="s1", name="s", description="d"))
        got = [e async for _, e in trainer.events(SkillIngested)]
        assert [e.skill_id for e in got] == ["big", "s1"] and got[0].description == big.description
        [digest] = await proxy.payloads.put_many([("ex-1", b"tokens")])
        assert await trainer.payloads.get("ex-1", digest) == b"tokens"
        await trainer.payloads.purge("ex-1")
        assert await trainer.payloads.get("ex-1", digest) is None
    finally:
        for log in (synth, proxy, trainer, admin):
            await log.close()


async def test_up_writes_the_users_once_and_its_server_requires_them(tmp_path: Path) -> None:
    data = tmp_path / "data"
    passwords: list[dict[str, str]] = []
    for _ in range(2):  # a second `up` resumes with the same passwords
        stack = Stack(Settings(data_dir=data), services=[])
        await stack.start()
        try:
            assert stack.nats is not None
            with pytest.raises(LogUnavailable, match="without credentials"):
                await EventLog.connect(stack.nats_url, timeout=3, create=False)
            log = await EventLog.connect(stack.nats_url, credentials=stack.admin_credentials, create=False)
            await log.close()
        finally:
            await stack.stop()
        creds = {u: read_nats_credentials(data, u) for u in [NATS_ADMIN, *SERVICE_CLASSES]}
        passwords.append({u: c.password for u, c in creds.items() if c is not None})
    assert passwords[0] == passwords[1] and len(passwords[0]) == 1 + len(SERVICE_CLASSES)
    for path in [nats_config_file(data), *(data / "auth" / "nats").iterdir()]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    users = [u["user"] for u in json.loads(nats_config_file(data).read_text())["authorization"]["users"]]
    assert sorted(users) == sorted([NATS_ADMIN, *SERVICE_CLASSES])


async def test_the_server_a_command_starts_on_a_stopped_stack_requires_the_same_users(tmp_path: Path) -> None:
    from opengyre.console import log_session  # the CLI's own session: what `opengyre events` etc. use

    data = tmp_path / "data"
    stack = Stack(Settings(data_dir=data), services=[])
    await stack.start()
    await stack.stop()
    settings = Settings.from_env(data_dir=data)
    async with log_session(settings) as log:
        url = log.nc.connected_url
        assert url is not None
        with pytest.raises(LogUnavailable, match="without credentials"):
            await EventLog.connect(f"nats://{url.netloc}", timeout=3, create=False)
        assert await log.last_seq() == 0


async def test_an_external_nats_that_requires_credentials_takes_the_ones_the_environment_names(
    tmp_path: Path, log_config: LogConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--nats-url: the users are the operator's; `up`, its services and the commands use OPENGYRE_NATS_USER and
    OPENGYRE_NATS_PASSWORD (here the server's admin user, as an operator's own would be)."""
    operator = tmp_path / "operator"
    server = EmbeddedNats(tmp_path / "store", config_file=write_nats_config(operator, log_config))
    server.start()
    try:
        settings = Settings(data_dir=tmp_path / "data", nats_url=server.url, log=log_config)
        refused = Stack(settings, services=[])
        with pytest.raises(LogUnavailable, match="refuses a connection without credentials"):
            await refused.start()
        creds = read_nats_credentials(operator, NATS_ADMIN)
        assert creds is not None
        monkeypatch.setenv("OPENGYRE_NATS_USER", creds.user)
        monkeypatch.setenv("OPENGYRE_NATS_PASSWORD", creds.password)
        stack = Stack(settings, services=["synth"])
        await stack.start()
        try:
            assert stack.admin_credentials == creds and not (settings.data_dir / "auth" / "nats").exists()
            log = await EventLog.connect(server.url, log_config, credentials=stack.admin_credentials)
            try:
                await log.append(SkillIngested(skill_id="ext", name="e", description="d"))
            finally:
                await log.close()
            # The service (its own process, the environment passed on) connected with them and folds the event.
            from opengyre.runtime import grpc_channel
            from opengyre.v1 import common_pb2, synth_pb2_grpc

            port = stack.children["synth"].port
            async with grpc_channel(f"127.0.0.1:{port}", settings.grpc_token()) as ch:
                stub = synth_pb2_grpc.SynthServiceStub(ch)

                async def folded() -> bool:
                    st = await stub.GetStatus(common_pb2.StatusRequest(), timeout=10)
                    return any(p.position >= 1 for p in st.projections)

                await await_until(folded, "synth folds the event through the operator's NATS user", polls=1200)
        finally:
            await stack.stop()
    finally:
        server.stop()


async def test_a_service_cannot_append_another_owners_event_type_on_the_same_execution(
    secured: tuple[EmbeddedNats, dict[str, NatsCredentials]], log_config: LogConfig
) -> None:
    """Through ``EventLog``, on one execution: the proxy appends its ``model-call-recorded`` after the scheduler's
    ``execution-dispatched`` (optimistic concurrency across the two owners' types holds), and cannot append the
    trainer's ``execution-finished`` (before per-type subjects it could: the subject was the execution's)."""
    server, users = secured
    admin = await EventLog.connect(server.url, log_config, credentials=users[NATS_ADMIN])  # makes the stream (up's)
    logs = {u: await EventLog.connect(server.url, log_config, credentials=users[u]) for u in ("scheduler", "proxy")}
    logs["admin"] = admin
    try:
        dispatched = await logs["scheduler"].append(
            ExecutionDispatched(execution_id="x1", task_id="t", group_id="g"), expected_last_subject_seq=0
        )
        call = ModelCallRecorded(execution_id="x1", call_id="c1", prompt_delta_ids=[1], output_ids=[2])
        with pytest.raises(ConcurrencyError):  # the scheduler's event counts: the aggregate's last is not 0
            await logs["proxy"].append(call, expected_last_subject_seq=0)
        recorded = await logs["proxy"].append(call, expected_last_subject_seq=dispatched.seq)
        with pytest.raises(EventLogError):
            await logs["proxy"].append(ExecutionFinished(execution_id="x1", status="completed", score=1.0))
        stored = [s.type_name async for s in logs["scheduler"].read(1)]
        assert stored == ["execution-dispatched", "model-call-recorded"] and recorded.seq == dispatched.seq + 1
    finally:
        for log in logs.values():
            await log.close()
