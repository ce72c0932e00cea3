"""The event log on a 3-node JetStream cluster (three nats-servers on loopback): a leader killed under appends
loses and doubles nothing; a lost majority is a loud NoQuorum; a refusal that would repeat is not retried."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from opengyre.eventlog import EventLog, LogConfig, NoQuorum
from opengyre.eventlog._acks import AckError
from opengyre.eventlog._retrying import append_retryable, deadline_s
from opengyre.events import ExecutionDispatched, SkillIngested
from opengyre.runtime import EmbeddedNats, NatsCluster
from tests._polling import await_until


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    c = NatsCluster(tmp_path / "nats", 3)
    c.start()
    yield c
    c.stop()


def _config(**kw: float) -> LogConfig:
    tag = uuid.uuid4().hex[:10]
    return LogConfig(stream=f"C{tag}", prefix=f"c{tag}.ev", blob_bucket=f"B{tag}", replicas=3, **kw)  # type: ignore[arg-type]


def _event(i: int) -> ExecutionDispatched:
    return ExecutionDispatched(execution_id=f"e{i}", task_id="t", group_id="g")


async def _leader(log: EventLog) -> str:
    info = await log.js.stream_info(log.config.stream)
    assert info.cluster is not None and info.cluster.leader
    return str(info.cluster.leader)


def _kill(cluster: NatsCluster, name: str) -> EmbeddedNats:
    node = next(n for n in cluster.nodes if n.cluster is not None and n.cluster.name == name)
    assert node.proc is not None
    node.proc.send_signal(signal.SIGKILL)
    node.proc.wait()
    return node


async def _stored_ids(log: EventLog) -> list[str]:
    return [s.event_id async for s in log.read()]


async def test_the_stream_and_the_blob_bucket_are_replicated_on_all_three_servers(cluster: NatsCluster) -> None:
    async with await EventLog.connect(cluster.url, _config(), configure=True) as log:
        info = await log.js.stream_info(log.config.stream)
        assert info.config.num_replicas == 3
        assert info.cluster is not None
        names = {info.cluster.leader, *(r.name for r in info.cluster.replicas or [])}
        assert names == {"n0", "n1", "n2"}
        # A body out of band (the object store's bucket) is replicated as its event is.
        big = SkillIngested(skill_id="big", name="b", description="x" * (log.config.inline_limit + 1))
        await log.append(big)
        bucket = await log.js.stream_info(f"OBJ_{log.config.blob_bucket}")
        assert bucket.config.num_replicas == 3


@pytest.mark.parametrize("pipelined", [False, True], ids=["awaited", "pipelined"])
async def test_killing_the_leader_during_appends_loses_none_and_doubles_none(
    cluster: NatsCluster, pipelined: bool
) -> None:
    n = 400
    async with await EventLog.connect(cluster.url, _config(), configure=True) as log:
        leader = await _leader(log)
        acked: list[str] = []

        async def write() -> None:
            for i in range(0, n, 20 if pipelined else 1):
                batch = [_event(j) for j in range(i, min(n, i + (20 if pipelined else 1)))]
                if pipelined:
                    await log.append_many(batch)
                else:
                    await log.append(batch[0])
                acked.extend(e.event_id for e in batch)

        writer = asyncio.create_task(write())
        await await_until(lambda: len(acked) >= n // 4 or writer.done(), "a quarter of the appends acknowledged")
        _kill(cluster, leader)
        await writer  # every append acknowledged, across the election
        assert len(acked) == n
        # Reads wait out the election too, and see each acknowledged event exactly once.
        stored = await _stored_ids(log)
        assert len(stored) == n, f"{n - len(set(stored))} lost, {len(stored) - len(set(stored))} doubled"
        assert set(stored) == set(acked)
        assert await _leader(log) != leader


async def test_a_lost_majority_fails_appends_loudly_and_a_returned_one_takes_them(cluster: NatsCluster) -> None:
    impatient = _config(retry_deadline_s=2.0)
    first, refused = _event(0), _event(1)
    # The streams made at the default deadline (a cluster just started elects its meta leader first: under the
    # suite's load that took past 2 s, and the impatient client's configure timed out); then the impatient one.
    async with await EventLog.connect(
        cluster.url, dataclasses.replace(impatient, retry_deadline_s=0.0), configure=True
    ):
        pass
    async with await EventLog.connect(cluster.url, impatient) as log:
        await log.append(first)
        leader = await _leader(log)
        others = [n for n in cluster.nodes if n.cluster is not None and n.cluster.name != leader]
        # The leader and one follower go: one of three servers is no majority.
        gone = [_kill(cluster, leader), _kill(cluster, others[0].cluster.name if others[0].cluster else "")]
        with pytest.raises(NoQuorum, match="no quorum"):
            await log.append(refused)
        for node in gone:
            cluster.restart(node)
    # The quorum is back: the refused event is appended now (waiting out the stream's election), once.
    async with await EventLog.connect(cluster.url, dataclasses.replace(impatient, retry_deadline_s=0.0)) as log:
        again = await log.append(refused)
        assert await _stored_ids(log) == [first.event_id, refused.event_id]
        assert again.seq == 2


def test_a_store_failure_is_not_retried_and_a_leader_election_is() -> None:
    assert not append_retryable(AckError(500, 10077, "Generic error when storing a message failed"))
    assert not append_retryable(AckError(400, 10071, "wrong last sequence: 3"))
    assert not append_retryable(AckError(503, 10047, "insufficient storage resources available"))
    assert append_retryable(AckError(503, 10008, "JetStream system temporarily unavailable"))
    assert append_retryable(AckError(503, 0, "no stream answers on this subject"))
    assert append_retryable(TimeoutError())


def test_the_retry_deadline_is_ten_seconds_on_one_server_and_thirty_on_a_cluster() -> None:
    assert deadline_s(LogConfig()) == 10.0
    assert deadline_s(LogConfig(replicas=3)) == 30.0
    assert deadline_s(LogConfig(replicas=3, retry_deadline_s=4.0)) == 4.0
    with pytest.raises(ValueError, match="retry_deadline_s"):
        LogConfig(retry_deadline_s=-1.0)
