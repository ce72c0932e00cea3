"""The event log against a real nats-server: dedup, optimistic concurrency, payload guard, reads."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import subprocess
from pathlib import Path

import pytest

from opengyre.eventlog import (
    BLOB_HEADER,
    MIN_SERVER_VERSION,
    ConcurrencyError,
    EventLog,
    LogConfig,
    LogUnavailable,
    require_server_version,
)
from opengyre.events import ExecutionDispatched, ExecutionFinished, ModelCallRecorded
from opengyre.runtime import EmbeddedNats, free_port, nats_server_binary
from tests._nats_ports import spawn_nats


def _dispatched(i: int) -> ExecutionDispatched:
    return ExecutionDispatched(execution_id=f"e{i}", task_id="t", group_id="g")


async def test_a_retried_publish_with_the_same_event_id_is_stored_once(event_log: EventLog) -> None:
    e = _dispatched(1)
    first = await event_log.append(e)
    again = await event_log.append(e)
    assert (first.seq, first.duplicate) == (1, False)
    assert (again.seq, again.duplicate) == (1, True)
    assert await event_log.last_seq() == 1
    many = await event_log.append_many([e, _dispatched(2), e])
    assert [a.duplicate for a in many] == [True, False, True]
    assert await event_log.last_seq() == 2


async def test_a_stale_expected_sequence_raises_concurrency_error(event_log: EventLog) -> None:
    first = await event_log.append(_dispatched(1), expected_last_subject_seq=0)
    fin = ExecutionFinished(execution_id="e1", status="completed", score=1.0)
    with pytest.raises(ConcurrencyError) as exc:
        await event_log.append(fin, expected_last_subject_seq=0)
    assert exc.value.subject.endswith(".execution.e1.execution-finished") and exc.value.expected == 0
    ok = await event_log.append(fin, expected_last_subject_seq=first.seq)
    assert ok.seq == 2
    # Another aggregate's sequence does not count against this one.
    await event_log.append(_dispatched(2), expected_last_subject_seq=0)


async def test_of_two_concurrent_appends_with_the_same_expectation_exactly_one_wins(event_log: EventLog) -> None:
    base = await event_log.append(_dispatched(7))
    attempts = [
        event_log.append(
            ExecutionFinished(execution_id="e7", status="completed", score=s), expected_last_subject_seq=base.seq
        )
        for s in (0.1, 0.2, 0.3, 0.4)
    ]
    results = await asyncio.gather(*attempts, return_exceptions=True)
    assert sum(not isinstance(r, Exception) for r in results) == 1
    assert all(isinstance(r, ConcurrencyError) for r in results if isinstance(r, Exception))
    assert await event_log.last_seq() == base.seq + 1


async def test_bodies_over_the_payload_limit_go_out_of_band_and_read_back(event_log: EventLog) -> None:
    big = ModelCallRecorded(
        execution_id="e1",
        call_id="c1",
        prompt_delta_ids=list(range(400_000)),  # ~2.6 MB of JSON: over JetStream's 1 MiB max payload
        output_ids=[1, 2],
        output_logprobs=[-0.1, -0.2],
    )
    small = _dispatched(1)
    await event_log.append_many([small, big])
    stored = [s async for s in event_log.read(1)]
    assert [s.type_name for s in stored] == ["execution-dispatched", "model-call-recorded"]
    assert event_log.decode(stored[1]) == big
    raw = await event_log.js.get_msg(event_log.config.stream, 2)
    assert raw.headers is not None and BLOB_HEADER in raw.headers and not raw.data
    assert event_log.decode(await event_log.get(2)) == big


async def test_reads_cover_exact_ranges_and_aggregate_filters(event_log: EventLog) -> None:
    events = []
    for i in range(30):
        events.append(_dispatched(i))
        if i % 3 == 0:
            events.append(ExecutionFinished(execution_id=f"e{i}", status="completed", score=0.5))
    events.append(
        ModelCallRecorded(execution_id="e1", call_id="c", prompt_delta_ids=[1], output_ids=[], output_logprobs=[])
    )
    await event_log.append_many(events)
    last = await event_log.last_seq()
    assert last == len(events)
    seqs = [s.seq async for s in event_log.read(5, 17)]
    assert seqs == list(range(5, 18))
    only = [s async for s in event_log.read(1, subjects=event_log.config.instance_filters("execution", "e3"))]
    assert [s.type_name for s in only] == ["execution-dispatched", "execution-finished"]
    assert [s.seq async for s in event_log.read(last + 1)] == []
    decoded = [event_log.decode(s) async for s in event_log.read(1)]
    assert decoded == events


async def test_a_read_whose_consumer_fails_mid_way_reads_on_from_the_next_sequence(event_log: EventLog) -> None:
    """A range read's ephemeral consumer can fail between two batches (deleted, or its leader not yet elected
    after a stream leader election answers pulls 503): the read goes on from the sequence after the last one it
    yielded, on a new consumer, instead of failing the reader. Every event once, in order."""
    await event_log.append_many([_dispatched(i) for i in range(200)])
    stream = event_log.config.stream
    seen: list[int] = []
    deleted: list[str] = []
    async for msgs in event_log.read_batches(1, batch=8):
        seen.extend(m.metadata.sequence.stream for m in msgs)
        # Twice (the read recovers more than once); the batches it already pulled are read out first.
        live = [c.name for c in await event_log.js.consumers_info(stream)]
        if len(deleted) < 2 and live:
            await event_log.js.delete_consumer(stream, live[0])
            deleted.append(live[0])
    assert seen == list(range(1, 201))
    assert len(set(deleted)) == 2


@pytest.mark.timeout(30)  # fails fast: no reconnect loop
async def test_no_server_fails_fast_with_a_clear_message() -> None:
    port = free_port()  # nothing is started on it: only "nobody listens here" is needed
    with pytest.raises(LogUnavailable, match=f"no NATS server answers at nats://127.0.0.1:{port}"):
        await EventLog.connect(f"nats://127.0.0.1:{port}", timeout=2.0)


async def test_a_server_without_jetstream_is_refused(tmp_path: Path) -> None:
    proc, ports = spawn_nats(nats_server_binary(), [], tmp_path)
    try:
        with pytest.raises(LogUnavailable, match="no JetStream"):
            await EventLog.connect(f"nats://127.0.0.1:{ports.client}", LogConfig(stream="NOJS"))
    finally:
        proc.terminate()
        proc.wait()


async def test_a_comma_separated_url_names_several_seed_servers(
    nats_server: EmbeddedNats, log_config: LogConfig
) -> None:
    dead = f"nats://127.0.0.1:{free_port()}"  # never bound: a seed nobody answers at
    # dont-randomize is not set: whichever seed is tried first, the live one is reached
    log = await EventLog.connect(f"{dead}, {nats_server.url}", log_config)
    try:
        assert await log.last_seq() == 0
    finally:
        await log.js.delete_stream(log_config.stream)
        await log.close()


async def test_replicas_a_single_server_cannot_hold_are_refused_clearly(
    nats_server: EmbeddedNats, log_config: LogConfig
) -> None:
    three = dataclasses.replace(log_config, replicas=3)
    with pytest.raises(LogUnavailable, match=r"refuses stream .* \(3 replica\(s\)\).*non-clustered"):
        await EventLog.connect(nats_server.url, three)


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("2.11.0", True),
        ("2.15.1", True),
        ("3.0.0", True),
        ("2.10.22", False),
        ("2.9.10", False),
        ("1.4.1", False),
        ("unknown", False),
    ],
)
def test_the_server_version_is_checked_against_what_the_log_needs(version: str, ok: bool) -> None:
    if ok:
        require_server_version(version, "nats://h:4222")
        return
    with pytest.raises(LogUnavailable, match=rf"nats://h:4222 .*{version!s}.*needs nats-server >= 2\.11\.0"):
        require_server_version(version, "nats://h:4222")


def _old_nats_server() -> Path:
    """A nats-server binary older than the log needs (Debian ships 2.9 as /usr/sbin/nats-server); skip visibly
    without."""
    for d in ("/usr/sbin", "/usr/bin", "/usr/local/bin"):
        path = Path(d) / "nats-server"
        if not path.is_file():
            continue
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=10).stdout
        m = re.search(r"v(\d+)\.(\d+)\.(\d+)", out)
        if m and tuple(int(g) for g in m.groups()) < MIN_SERVER_VERSION:
            return path
    pytest.skip("no nats-server older than 2.11 on this machine to check the refusal against a real one")


async def test_a_nats_server_older_than_2_10_is_refused_with_both_versions(tmp_path: Path) -> None:
    """Before: a 2.9 server was accepted, and it silently ignores a consumer's filter_subjects."""
    binary = _old_nats_server()
    proc, ports = spawn_nats(binary, ["-js", "-sd", str(tmp_path / "js")], tmp_path / "ports")
    try:
        with pytest.raises(LogUnavailable, match=r"is nats-server 2\.9\.\d+; OpenGyre needs nats-server >= 2\.11\.0"):
            await EventLog.connect(f"nats://127.0.0.1:{ports.client}", LogConfig(stream="OLD"))
    finally:
        proc.terminate()
        proc.wait()


async def test_an_unreadable_version_header_is_reported_as_such(event_log: EventLog) -> None:
    from opengyre.events import MalformedEvent

    subj = event_log.config.subject
    await event_log.append(ExecutionDispatched(execution_id="a", task_id="t", group_id="g"))
    await event_log.js.publish(
        subj("execution", "v"), b"{}", headers={"Og-Type": "cell-registered", "Og-Version": "abc"}
    )
    stored = [s async for s in event_log.read()][-1]
    with pytest.raises(MalformedEvent, match=r"cell-registered: bad Og-Version header 'abc'"):
        event_log.decode(stored)


async def test_a_log_written_under_the_untyped_subjects_still_reads(event_log: EventLog) -> None:
    """Before per-type subjects an execution's events were on ``<prefix>.execution.<id>``: such a log's events
    are read, decoded and filtered along with the new ones."""
    old = _dispatched(1)
    ack = await event_log.js.publish(
        event_log.config.subject("execution", "e1"),
        event_log.registry.encode(old),
        headers={"Og-Type": old.type_name(), "Nats-Msg-Id": old.event_id},
    )
    new = ExecutionFinished(execution_id="e1", status="completed", score=1.0)
    appended = await event_log.append(new)
    cfg = event_log.config
    for filters in (cfg.instance_filters("execution", "e1"), [cfg.aggregate_filter("execution")], None):
        got = [s async for s in event_log.read(1, subjects=filters)]
        assert [s.seq for s in got] == [ack.seq, appended.seq], filters
        assert [event_log.decode(s) for s in got] == [old, new]
    assert [s.subject for s in got] == [cfg.subject("execution", "e1"), cfg.subject("execution", "e1", new.type_name())]
