"""The payload store and the stream limits against a real nats-server: content-addressed puts stored once,
parts for payloads larger than a message, purges by scope, and full streams that refuse instead of dropping."""

from __future__ import annotations

import hashlib
import os

import pytest

from opengyre.eventlog import EventLog, EventLogError, LogConfig, LogUnavailable, PayloadStoreError
from opengyre.events import ExecutionDispatched
from opengyre.runtime import EmbeddedNats


async def test_the_same_payload_put_twice_is_stored_once(event_log: EventLog) -> None:
    store = event_log.payloads
    a, b, a2 = await store.put_many([("ex-1", b"alpha"), ("ex-1", b"beta"), ("ex-1", b"alpha")])
    assert a == a2 == hashlib.sha256(b"alpha").hexdigest() and b != a
    assert await store.put("ex-1", b"alpha") == a  # a retry after a lost acknowledgement
    assert (await store.usage())[0] == 2
    assert await store.get("ex-1", a) == b"alpha"
    assert await store.get("ex-2", a) is None  # scoped: another execution does not have it
    fetched = await store.get_many([("ex-1", a), ("ex-1", b), ("ex-1", "0" * 64)])
    assert fetched.found == {("ex-1", a): b"alpha", ("ex-1", b): b"beta"}
    assert fetched.failed == {("ex-1", "0" * 64): "payload-missing"}


async def test_a_payload_larger_than_a_message_goes_in_parts(event_log: EventLog) -> None:
    big = os.urandom(event_log.nc.max_payload * 2 + 123)
    digest = await event_log.payloads.put("ex-1", big)
    assert (await event_log.payloads.usage())[0] == 3
    assert await event_log.payloads.get("ex-1", digest) == big
    small = await event_log.payloads.put("ex-1", b"small")
    # A batch read gets the whole execution in one request (parts included), not one request per payload.
    batch = await event_log.payloads._get_scope("ex-1")
    assert batch is not None and len(batch) == 4
    fetched = await event_log.payloads.get_many([("ex-1", digest), ("ex-1", small), ("ex-9", small)])
    assert fetched.found == {("ex-1", digest): big, ("ex-1", small): b"small"}
    assert fetched.failed == {("ex-9", small): "payload-missing"}


async def test_a_payload_with_the_wrong_content_is_corrupt(event_log: EventLog) -> None:
    store = event_log.payloads
    await store.ensure()
    fake = hashlib.sha256(b"what it should be").hexdigest()
    await event_log.js.publish(store.subject("ex-1", fake), b"something else", stream=store.stream)
    with pytest.raises(PayloadStoreError, match="corrupt"):
        await store.get("ex-1", fake)
    assert (await store.get_many([("ex-1", fake)])).failed == {("ex-1", fake): "payload-corrupt"}


async def test_a_purge_deletes_one_scope_below_a_sequence(event_log: EventLog) -> None:
    store = event_log.payloads
    old, other = await store.put_many([("ex-1", b"old"), ("ex-2", b"other")])
    mark = await store.last_seq()
    late = await store.put("ex-1", b"late")  # stored after the compaction decided
    await store.purge("ex-1", below_seq=mark + 1)
    assert await store.get("ex-1", old) is None
    assert await store.get("ex-1", late) == b"late" and await store.get("ex-2", other) == b"other"
    await store.purge("ex-1")
    assert await store.get("ex-1", late) is None and await store.get("ex-2", other) == b"other"


async def test_a_full_payload_stream_refuses_new_payloads_and_keeps_the_old(
    nats_server: EmbeddedNats, log_config: LogConfig
) -> None:
    cfg = LogConfig(
        stream=log_config.stream, prefix=log_config.prefix, blob_bucket=log_config.blob_bucket, payload_max_bytes=4096
    )
    log = await EventLog.connect(nats_server.url, cfg)
    try:
        kept = await log.payloads.put_many([("ex-1", os.urandom(1000)) for _ in range(3)])
        with pytest.raises(PayloadStoreError, match="refused"):
            await log.payloads.put_many([("ex-1", os.urandom(1000)) for _ in range(3)])
        got = await log.payloads.get_many([("ex-1", d) for d in kept])
        assert len(got.found) == 3 and not got.failed  # discard "new": nothing stored was dropped for room
    finally:
        await log.js.delete_stream(cfg.payloads)
        await log.js.delete_stream(cfg.stream)
        await log.close()


async def test_a_full_event_stream_refuses_appends_and_drops_no_event(
    nats_server: EmbeddedNats, log_config: LogConfig
) -> None:
    log = await EventLog.connect(nats_server.url, log_config)
    try:
        await log.append_many([ExecutionDispatched(execution_id=f"e{i}", task_id="t", group_id="g") for i in range(50)])
        used = (await log.js.stream_info(log_config.stream)).state.bytes
        await log.close()
        # The same stream reconfigured with a byte limit just above what it holds (as `opengyre up` does when
        # the limit is set): old events stay, new ones are refused once it is full.
        capped = LogConfig(
            stream=log_config.stream, prefix=log_config.prefix, blob_bucket=log_config.blob_bucket, max_bytes=used + 600
        )
        log = await EventLog.connect(nats_server.url, capped, configure=True)
        with pytest.raises(EventLogError, match="refused"):
            for i in range(50, 100):
                await log.append(ExecutionDispatched(execution_id=f"e{i}", task_id="t", group_id="g"))
        info = await log.js.stream_info(log_config.stream)
        assert info.state.first_seq == 1 and info.state.messages == info.state.last_seq > 50  # none dropped
        seen = [e.execution_id async for _, e in log.events(ExecutionDispatched)]
        assert seen[:50] == [f"e{i}" for i in range(50)]
    finally:
        await log.js.delete_stream(log_config.stream)
        await log.close()


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        LogConfig(max_bytes=0)
    with pytest.raises(ValueError, match="payload_max_age_s"):
        LogConfig(payload_max_age_s=-1)
    assert LogConfig(stream="X").payloads == "X_PAYLOADS"


async def test_only_the_owner_changes_a_streams_limits_and_clients_see_how_full_it_is(
    nats_server: EmbeddedNats, log_config: LogConfig
) -> None:
    """Issue 24 item 7: a client connecting with the default config used to reset ``max_bytes`` to unlimited."""
    names = {"stream": log_config.stream, "prefix": log_config.prefix, "blob_bucket": log_config.blob_bucket}
    capped = LogConfig(**names, max_bytes=8 * 1024, payload_max_bytes=64 * 1024)  # what `up` sets
    owner = await EventLog.connect(nats_server.url, capped, configure=True)
    try:
        for client in (
            await EventLog.connect(nats_server.url, log_config),  # a service or CLI with the default limits
            await EventLog.connect(nats_server.url, log_config, create=False),
        ):
            await client.payloads.ensure()
            await client.close()
        info = await owner.js.stream_info(capped.stream)
        payloads = await owner.js.stream_info(capped.payloads)
        assert (info.config.max_bytes, payloads.config.max_bytes) == (8 * 1024, 64 * 1024)  # still the owner's

        client = await EventLog.connect(nats_server.url, log_config, create=False)
        try:
            assert not (await client.usage()).full
            appended = 0
            with pytest.raises(EventLogError, match="refused"):
                for i in range(1000):
                    await client.append(ExecutionDispatched(execution_id=f"e{i}", task_id="t", group_id="g"))
                    appended += 1
            usage = await client.usage()
            assert usage.full and usage.max_bytes == 8 * 1024 and usage.messages == appended > 0, usage
            assert f"of {8 * 1024} B" in usage.describe() and f"in {appended} events" in usage.describe()
        finally:
            await client.close()
    finally:
        await owner.js.delete_stream(capped.payloads)
        await owner.js.delete_stream(capped.stream)
        await owner.close()


async def test_a_client_that_may_not_create_the_stream_says_it_is_missing(
    nats_server: EmbeddedNats, log_config: LogConfig
) -> None:
    with pytest.raises(LogUnavailable, match=f"no event stream '{log_config.stream}'.*opengyre up"):
        await EventLog.connect(nats_server.url, log_config, create=False)


async def test_the_streams_are_stored_compressed_as_their_owner_configures_them(
    nats_server: EmbeddedNats, log_config: LogConfig
) -> None:
    """S2 block compression by default on both streams; the owner (`up`) brings an existing stream to its
    setting, and a client with another one changes nothing (one owner of the stream's configuration)."""
    names = {"stream": log_config.stream, "prefix": log_config.prefix, "blob_bucket": log_config.blob_bucket}
    plain = LogConfig(**names, compression="none")
    first = await EventLog.connect(nats_server.url, plain, configure=True)
    await first.payloads.ensure()

    async def compressions() -> tuple[str | None, str | None]:
        ev = await first.js.stream_info(plain.stream)
        pl = await first.js.stream_info(plain.payloads)
        return ev.config.compression, pl.config.compression

    try:
        assert await compressions() == ("none", "none")
        client = await EventLog.connect(nats_server.url, LogConfig(**names))  # the default, s2: not the owner
        await client.payloads.ensure()
        await client.close()
        assert await compressions() == ("none", "none")
        owner = await EventLog.connect(nats_server.url, LogConfig(**names), configure=True)
        await owner.close()
        assert await compressions() == ("s2", "s2")
    finally:
        await first.js.delete_stream(plain.payloads)
        await first.close()


def test_an_unknown_compression_is_refused() -> None:
    with pytest.raises(ValueError, match="compression must be one of s2, none, not 'zstd'"):
        LogConfig(compression="zstd")
