"""The event log on a 3-node JetStream cluster against one nats-server: append throughput as a ratio (pipelined
and awaited, measured in the same run, rounds alternated), and a leader killed under awaited appends (how many
appended, lost, doubled, and the longest stall between two acknowledgements).

    .venv/bin/python bench/cluster_bench.py                        # 20k pipelined, 2k awaited, 3 rounds, 600 kill
    .venv/bin/python bench/cluster_bench.py --pipelined 5000 --awaited 500 --rounds 1 --kill-appends 300  # quick
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from opengyre.eventlog import EventLog, LogConfig
from opengyre.events import ExecutionFinished
from opengyre.runtime import EmbeddedNats, NatsCluster


def _config(replicas: int) -> LogConfig:
    tag = uuid.uuid4().hex[:8]
    return LogConfig(stream=f"CB{tag}", prefix=f"cb{tag}.ev", blob_bucket=f"CBB{tag}", replicas=replicas)


def _events(n: int) -> list[ExecutionFinished]:
    return [ExecutionFinished(execution_id=f"x{i % 5000}", status="completed", score=0.5) for i in range(n)]


async def _rates(url: str, replicas: int, pipelined: int, awaited: int) -> tuple[float, float]:
    """Events/s appended with ``append_many`` (2048 in flight) and with one awaited ``append`` at a time."""
    async with await EventLog.connect(url, _config(replicas), configure=True) as log:
        events = _events(pipelined)
        t = time.perf_counter()
        await log.append_many(events)
        pipe = pipelined / (time.perf_counter() - t)
        events = _events(awaited)
        t = time.perf_counter()
        for e in events:
            await log.append(e)
        one = awaited / (time.perf_counter() - t)
        await log.js.delete_stream(log.config.stream)
    return pipe, one


async def _leader_kill(cluster: NatsCluster, n: int) -> dict[str, float]:
    """``n`` awaited appends; the stream's leader SIGKILLed after a third of them (and restarted at the end)."""
    async with await EventLog.connect(cluster.url, _config(3), configure=True) as log:
        info = await log.js.stream_info(log.config.stream)
        leader = info.cluster.leader if info.cluster else None
        node = next(m for m in cluster.nodes if m.cluster is not None and m.cluster.name == leader)
        acked: list[str] = []
        times: list[float] = []
        t0 = time.perf_counter()
        for i, e in enumerate(_events(n)):
            if i == n // 3:
                assert node.proc is not None
                node.proc.send_signal(signal.SIGKILL)
                node.proc.wait()
                killed_at = time.perf_counter()
            await log.append(e)
            acked.append(e.event_id)
            times.append(time.perf_counter())
        stored = [s.event_id async for s in log.read()]
        new = await log.js.stream_info(log.config.stream)
        cluster.restart(node)
        gaps = [b - a for a, b in zip([t0, *times], times, strict=False)]
        return {
            "appends": float(n),
            "acked": float(len(acked)),
            "stored": float(len(stored)),
            "lost": float(len(set(acked) - set(stored))),
            "doubled": float(len(stored) - len(set(stored))),
            "stall_s": max(gaps),
            "first_ack_after_kill_s": next(t for t in times if t > killed_at) - killed_at,
            "new_leader_differs": float(bool(new.cluster and new.cluster.leader != leader)),
        }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pipelined", type=int, default=20000)
    ap.add_argument("--awaited", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kill-appends", type=int, default=600)
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the retries of the election are expected: the counts say the rest
    with tempfile.TemporaryDirectory() as tmp:
        single = EmbeddedNats(Path(tmp) / "one")
        cluster = NatsCluster(Path(tmp) / "cluster", 3)
        single.start()
        cluster.start()
        try:
            one: list[tuple[float, float]] = []
            three: list[tuple[float, float]] = []
            for _ in range(args.rounds):  # alternated, so a busy moment of the machine hits both
                one.append(await _rates(single.url, 1, args.pipelined, args.awaited))
                three.append(await _rates(cluster.url, 3, args.pipelined, args.awaited))
            kill = await _leader_kill(cluster, args.kill_appends)
        finally:
            cluster.stop()
            single.stop()
    p1, p3 = (statistics.median(r[0] for r in rs) for rs in (one, three))
    a1, a3 = (statistics.median(r[1] for r in rs) for rs in (one, three))
    print(f"append throughput, median of {args.rounds} alternated rounds (events/s)")
    print(f"  {'':28}{'1 node':>10}{'3 nodes R3':>12}{'1/3 ratio':>11}")
    print(f"  {'pipelined (append_many)':28}{p1:>10.0f}{p3:>12.0f}{p1 / p3:>10.2f}x")
    print(f"  {'awaited (append)':28}{a1:>10.0f}{a3:>12.0f}{a1 / a3:>10.2f}x")
    print(f"leader killed after {args.kill_appends // 3} of {args.kill_appends} awaited appends")
    print(
        f"  acked {kill['acked']:.0f}/{kill['appends']:.0f}, stored {kill['stored']:.0f}, lost {kill['lost']:.0f}, "
        f"doubled {kill['doubled']:.0f}, longest stall {kill['stall_s']:.2f} s, new leader: "
        f"{'yes' if kill['new_leader_differs'] else 'no'}"
    )


if __name__ == "__main__":
    asyncio.run(main())
